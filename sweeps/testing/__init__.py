"""Test seams used by the suite and the demos: fault injection into trials (``faults``) and
trials simulated from a known law (``simulate``)."""
