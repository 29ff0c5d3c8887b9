"""The server under test, as the config describes it (section ``target:``).

The live part (starting, watching and stopping the server) is ``soak.run.target``;
this package holds only what the config stage needs, so ``soak.config`` imports
no part of the run.
"""
