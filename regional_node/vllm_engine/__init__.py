"""`engine: vllm`: the node runs vLLM's own engine (the V1 AsyncLLM) behind the node's API.

vLLM is imported only when such a node loads a model; see engine.py.
"""

from regional_node.vllm_engine.engine import VllmEngine

__all__ = ["VllmEngine"]
