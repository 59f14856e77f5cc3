"""Regression gates: pytest tests on pytest-benchmark's ``benchmark`` fixture (GPU only).

- ``spec``: what is gated (shapes, own-kernel variants, peers, phases), the protocol, the
  limits, the injections, the baseline file of a GPU model and the pytest command (pure);
- ``baseline``: the baseline file: several fresh processes merged, loaded and validated (pure);
- ``checks``: each benchmark's checks against its baseline, the table, the machine line (pure);
- ``plugin``: the pytest hooks (each test's verdict, machine info, refusals, the section);
- ``cli``: ``python -m suite gate`` (``nox -s gate``): a check, or ``--save``;
- ``inject``: deliberately worse variants (``CCE_GATE_INJECT``) that prove the gate fails;
- ``cache``: a shape's inputs kept on disk between the processes of one session;
- ``test_gates.py`` / ``conftest.py``: the benchmarks, run by ``python -m suite gate`` (never by
  the default ``pytest``, whose testpaths are ``tests/``);
- ``prove.sh`` / ``proof``: the proof on a GPU and its summary.
"""
