"""What every reader yields for a row."""

from __future__ import annotations

from typing import Any

# line (or row) number, the record (None where it is already dropped), (reason, detail, the row as read) or None,
# bytes of its JSON
Row = tuple[int, Any, "tuple[str, str, Any] | None", int]
