import sys

from agent.cli import main

# guarded: a dask worker process (agent/evaluation/executor.py) is started by multiprocessing's spawn, which imports the main
# module again under another name; the CLI must not run a second time there
if __name__ == "__main__":
    sys.exit(main())
