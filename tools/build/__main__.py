"""`python -m tools.build kernels/TASK [--build-dir D] [--json]`: tools/build/build.py's command line."""

import sys

from tools.build.build import main

sys.exit(main())
