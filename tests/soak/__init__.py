"""The soak (issue 22): an hour of mixed, overlapping faults on the real parts, nothing lost.

``tox -e soak`` (``python -m tests.soak --minutes 60 --seed S``); ``test_soak_short.py``
is the 3-minute run of the interop CI. What is checked:
docs/reliability.md#the-soak-testssoak-tox-e-soak.
"""
