import sys

from pathtwt.cli import main

sys.exit(main())
