"""The ``rayless`` command line and top-level conveniences.

Sits at the top of the layering, beside ``scripts/``: it may import every package, and no
package imports it.
"""

__version__ = "0.1.0"
