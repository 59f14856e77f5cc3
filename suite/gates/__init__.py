"""Regression gates: pytest tests on pytest-benchmark's ``benchmark`` fixture (GPU only).

- ``spec``: what is gated (shapes, providers, phases), the thresholds, the baseline file of a GPU
  model and the pytest command of the gate (pure, no torch);
- ``checks``: the memory and accuracy checks on ``extra_info`` and the gate's table (pure);
- ``plugin``: the pytest hooks (machine info, refusal of another GPU's baseline, the checks);
- ``inject``: deliberately worse variants (``CCE_GATE_INJECT``) that prove the gate fails;
- ``test_gates.py`` / ``conftest.py``: the benchmarks, run by ``python -m suite gate`` or
  ``nox -s gate`` (never by the default ``pytest``, whose testpaths are ``tests/``);
- ``prove.sh``: the proof on a GPU (save, pass twice, fail on each injected variant).
"""
