"""``python -m suite.plots``: the same as ``python -m suite plots``."""
import argparse

from suite.plots import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m suite.plots",
                                 description="Draw every figure from the curated runs.")
add_arguments(parser)
raise SystemExit(main(parser.parse_args()))
