"""Encodes a text with a tokenizer.json (Hugging Face `tokenizers`) and with a GGUF's own tokenizer in llama.cpp
(`llama-server`'s /tokenize), line by line and as a whole, and compares the ids.

usage: tokenize_compare.py LLAMA_SERVER MODEL.gguf TOKENIZER.json TEXT_FILE LINES
The text is TEXT_FILE's lines followed by generated lines (code, digits, accents, CJK, emoji, runs of spaces and
tabs, contractions) up to LINES lines. Prints a JSON summary; exits 1 on the first mismatch, showing it.
"""

import json
import random
import socket
import subprocess
import sys
import time
import urllib.request

from tokenizers import Tokenizer

server_bin, model, tok_file, text_file, n_lines = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
lines = open(text_file, encoding="utf-8").read().split("\n")
rng = random.Random(5)
pieces = ["def f(x):", "    return x**2  # square", "int main() { return 0; }", "3.14159", "1234567890",
          "naïve café résumé", "Ünïcödé ß", "東京タワー", "你好，世界", "🙂🚀", "  two  spaces", "\ttab\tseparated",
          "don't I'LL we've", "HTTP/1.1 200 OK", "e-mail@example.com", "<html><body>", "x = [1, 2, 3]",
          "¿Qué?", "Ελληνικά", "русский текст", "   ", "a\u00a0b"]
while len(lines) < n_lines:
    lines.append(" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))))
lines = lines[:n_lines]

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
proc = subprocess.Popen([server_bin, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "512",
                         "-t", "1", "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


try:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"llama-server exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.2)
    else:
        sys.exit("llama-server did not become healthy")
    hf = Tokenizer.from_file(tok_file)
    total = 0
    for i, line in enumerate(lines + ["\n".join(lines)]):
        theirs = post("/tokenize", {"content": line, "add_special": False})["tokens"]
        ours = hf.encode(line, add_special_tokens=False).ids
        if ours != theirs:
            where = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            print(json.dumps({"mismatch_line": i, "text": line[:200], "at": where, "ours": ours[where:where + 8],
                              "llama.cpp": theirs[where:where + 8]}, ensure_ascii=False))
            sys.exit(1)
        total += len(ours)
    print(json.dumps({"lines": len(lines), "tokens": total, "identical": True}))
finally:
    proc.terminate()
    proc.wait()
