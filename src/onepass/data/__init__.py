"""Small CLINC150 / BANKING77 subsets (upstream layout) and the hand-written probe cases,
shipped so the defaults work from a wheel with no ../shared/data beside it (see README.md
here for their origin and licences)."""
