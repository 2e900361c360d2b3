"""The store: tiles, calibration tiles, discovery plans, compressed models and tile features,
kept by what made them and shared by every study (and every checkout of a lab) that names
the same folder (the config's ``store:``, default ``results/store``).

Keys (:mod:`.keys`). Every entry's key is derived before anything runs from everything that
can change its values, as Nix derives a store path from its inputs: a sha256 of the entry's
kind, its format and its inputs as canonical JSON. Which config settings are inputs is
decided in one table, :mod:`pathtwt.config.store_keys`; the keys of a study's products are
computed once per slide and model by :mod:`pathtwt.config.products`. This package only
hashes, lays out, locks, publishes, checks and lists.

Layout (:class:`.layout.Store`)::

    {store}/STORE.json                             what the folder is (its format)
    {store}/tiles/{T}.coords.h5, {T}.thumbnail.png one slide's tiles and thumbnail
    {store}/tiles/{T}.json                         ... and their record, written last
    {store}/calibration/{C}.h5, {C}.json           calibration tiles
    {store}/discovery/{D}/                         plan.json, similarity.npy/.png, entry.json
    {store}/models/{M}/                            model.safetensors, model.json, entry.json
    {store}/features/{E}/entry.json                an extractor: a model and the settings
    {store}/features/{E}/{T}.h5                    one slide's features by that extractor
    {store}/features/{E}/sets/{S}.json             the slides one extraction job made, all done
    {store}/.locks/                                who is making what, now

Records (:mod:`.records`). Every entry carries its key's inputs: a JSON record beside a file
entry or in a folder entry; a slide's features file names its extractor (its folder) and its
tiles (its name, and its ``coords_path`` attribute, readable with h5ls). A record whose
inputs do not give the entry's key (moved by hand, corrupted) is refused in one line.

Publishing (:mod:`.make`). An entry is complete or absent: a folder entry is built under a
hidden name and renamed into place; a file entry's files are each written by rename
(:mod:`pathtwt.io.atomic`) and its record last, the record being what says it is there; a
slide's features file is itself the entry. Whoever makes an entry holds its lock
(:mod:`.lock`) meanwhile, so two runs (of one checkout or two) never make the same entry
twice, and one that finds an entry made by another leaves it as it is. A cohort's
extraction claims each slide's entry on its own (:mod:`.features_set`): a slide finished
before a job is killed stays, and the next run embeds only the rest.

A study's folder keeps what is its own (labels, MIL runs, report) and links into the store
where its readers expect files (:mod:`.views`), with a manifest of the entries it used.
``pathtwt store ls / du / gc`` (:mod:`.maintenance`) show and prune the store.
"""
