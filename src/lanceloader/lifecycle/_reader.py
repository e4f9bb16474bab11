"""Entry point of the clean reader process (``python -m lanceloader.lifecycle._reader PREFIX``).

Started by :class:`lanceloader.lifecycle.forksafe.CleanReader` for processes that must not call Lance.
"""

import sys
import warnings

from lanceloader.lifecycle.forksafe import serve

if __name__ == "__main__":
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    serve(sys.argv[1])
