"""The fleet's Lua scripts: one file per lane or gate state transition.

A package (rather than a plain directory) so ``importlib.resources`` finds the ``.lua`` files
in an installed wheel as well as in a checkout; :mod:`workers.fleet.scripts` loads and registers
them.
"""
