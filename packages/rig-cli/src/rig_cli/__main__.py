import sys

from rig_cli.main import main

sys.exit(main())
