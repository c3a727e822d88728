"""The drop-in kit: the base every object `teola.optimize` returns derives from (`DropIn`)."""

from teola_core.dropin.base import DropIn

__all__ = ["DropIn"]
