from .args import TransformerArgs, count_params, flops_per_token
from .flavors import FLAVORS
from .model import Transformer

__all__ = ["FLAVORS", "Transformer", "TransformerArgs", "count_params", "flops_per_token"]
