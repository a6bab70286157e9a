"""Write a GGUF with gguf-py's GGUFWriter holding every metadata value type (nested arrays too) and tensors of
several types. Usage: gguf_write_all_types.py OUT.gguf"""
import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType, GGUFValueType

w = GGUFWriter(sys.argv[1], "llama")
w.add_uint8("t.u8", 200)
w.add_int8("t.i8", -100)
w.add_uint16("t.u16", 60000)
w.add_int16("t.i16", -30000)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -2000000000)
w.add_float32("t.f32", 0.1)
w.add_bool("t.bool", True)
w.add_string("t.string", "héllo, wörld")
w.add_uint64("t.u64", 2**63 + 5)
w.add_int64("t.i64", -(2**62))
w.add_float64("t.f64", 1e-300)
w.add_array("t.strings", ["a", "bc", "", "ünïcode"])
w.add_array("t.ints", [1, -2, 3])
w.add_array("t.floats", [0.5, -1.25])
w.add_array("t.bools", [True, False])
w.add_array("t.nested", [[1, 2], [3]])
w.add_array("t.nested_strings", [["x", "y"], ["z"]])
rng = np.random.default_rng(7)
w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
w.add_tensor("f16", rng.standard_normal((2, 64)).astype(np.float16))
w.add_tensor("one", np.ones((1, 7), dtype=np.float32))
q8 = rng.integers(0, 256, size=(4, 34 * 2), dtype=np.uint8)  # 4 rows of 64 Q8_0 elements
w.add_tensor("q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
