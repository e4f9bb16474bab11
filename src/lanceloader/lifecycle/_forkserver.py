"""Imported first by the forkserver that starts process workers (never by users).

The server imports Lance but never uses it, so forking it is safe; Lance's fork warning (meant
for processes that did Lance I/O) would only be noise on every worker start.
"""

import warnings

warnings.filterwarnings("ignore", message="lance is not fork-safe")
