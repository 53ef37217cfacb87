"""The benchmarks, one program per module: run one from the repository root, as `python benchmarks/NAME.py` or
`python -m benchmarks.NAME`. A benchmark that uses another's code imports it as `benchmarks.NAME` when it is
imported itself (the tests, `-m`) and by its bare name when it runs as a script (Python puts the script's folder
first on the path); the two that use the tests' helpers (`bus_overhead`, `executor_costs`) need the repository
root on the path: `python -m`, or `PYTHONPATH=$PWD`."""
