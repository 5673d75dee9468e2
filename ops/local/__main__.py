"""``python -m ops.local``: the whole service on this machine (``make run``)."""

import sys

from ops.local.stack import main

sys.exit(main())
