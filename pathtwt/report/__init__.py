"""The results report: tables per task (CSV, Markdown) and the HTML page."""
