"""Fast-Program kernels, one folder per op: ``naive.py`` (readable fp32 torch, the op's oracle), ``triton.py``
(kernels and their launcher), ``__init__.py`` (exports). See docs/ops.md."""
