"""``corpus-assets``, the command line: ``main`` (the entry: error lines, exit codes),
``parser`` (every command and option, nothing else), ``common`` (what every command shares),
``interrupt`` (Ctrl-C and SIGTERM), ``instance``/``runs``/``observe`` (the Dagster side), and
``commands`` (one module per group of commands, each imported only when one of its commands
runs, so ``--help`` never loads Dagster or the core)."""
