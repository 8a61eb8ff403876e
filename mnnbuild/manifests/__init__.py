"""The data a stage reads and writes: per stage, its Inputs, Params and Manifest models.

One module per stage, so a stage imports the manifests it reads without importing the stage that
writes them (and its code), and a model's shape enters exactly the keys of the stages that use it.
This package imports nothing, so importing one module never pulls in the others.
"""
