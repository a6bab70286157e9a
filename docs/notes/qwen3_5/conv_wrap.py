import sys, runpy
sys.path.insert(0, "/root/.cache/quantfarm/llama.cpp-0.3.36")
import conversion.base as b
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
runpy.run_path("/root/.cache/quantfarm/llama.cpp-0.3.36/convert_hf_to_gguf.py", run_name="__main__")
