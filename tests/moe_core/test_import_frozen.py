"""``moe_core.lazy.import_frozen`` and ``freeze_heap``: a trial worker imports its training stack
with the collector paused and freezes it; a process that froze its heap already (this test
process, tests/conftest.py) is left as it is."""

from __future__ import annotations

import gc
import subprocess
import sys

from moe_core.lazy import freeze_heap, import_frozen

FRESH = """
import gc, sys
from moe_core.lazy import import_frozen
assert gc.get_freeze_count() == 0 and "colorsys" not in sys.modules
import_frozen("colorsys")
frozen = gc.get_freeze_count()
assert "colorsys" in sys.modules and frozen > 0 and gc.isenabled(), frozen
gc.disable()  # the collector's state is restored, not switched on
import_frozen("json", "fractions")
assert not gc.isenabled() and "fractions" in sys.modules
gc.enable()
import_frozen("colorsys", "fractions")  # all imported: nothing done
assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
print("ok")
"""


def test_a_fresh_process_imports_then_freezes_keeping_the_collectors_state():
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_heap_frozen_before_is_not_frozen_again():
    assert gc.get_freeze_count() > 0  # the test process froze its own (conftest)
    before = gc.get_freeze_count()
    keep = [[] for _ in range(1000)]  # tracked objects made after that freeze
    freeze_heap()
    import_frozen("wave")
    assert gc.get_freeze_count() == before and gc.isenabled() and "wave" in sys.modules
    del keep
