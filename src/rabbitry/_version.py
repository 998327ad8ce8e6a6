"""The version of the package (``rabbitry.__version__``), a leaf any module may import."""

__version__ = "0.1.0.dev0"
