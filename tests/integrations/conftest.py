"""The framework integrations' tests. The verl tests (``tests/integrations/verl``) run only in the verl environment
``.venv-verl`` (``make test-verl``; ``make test`` runs both environments): verl 0.9 pins transformers<5.11, so it
cannot share the main environment. There verl is installed and the folder is collected; in the main environment,
which never has verl, the folder is not collected at all (nothing is skipped). In the verl environment a test that
finds verl missing fails."""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("verl") is not None else ["verl"]
