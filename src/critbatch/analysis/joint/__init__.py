"""The joint model of every run's loss (`joint`, on science/joint.py) and its report section
(`report`)."""
