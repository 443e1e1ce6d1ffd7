"""The IPython face: the %%distributed magics, their options, and cell compilation. The only layer that imports IPython at module level."""
