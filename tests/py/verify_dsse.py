"""Verifies a DSSE envelope with securesystemslib (the DSSE reference implementation), independently of quantfarm.

Usage: verify_dsse.py ENVELOPE.json PUBLIC_KEY_TEXT
PUBLIC_KEY_TEXT is quantfarm's public key form, `quantfarm-ed25519-public:<base64 of the 32-byte key>`; the keyid
is its fingerprint as the envelope names it. Prints one JSON line: {"verified", "payload_type", "statement_type",
"predicate_type", "subjects"}; exits 1 when the envelope does not verify.
"""

import base64
import json
import sys

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey


def main() -> int:
    env_path, key_text = sys.argv[1], sys.argv[2].strip()
    prefix = "quantfarm-ed25519-public:"
    if not key_text.startswith(prefix):
        raise SystemExit(f"not a quantfarm public key: {key_text[:30]}...")
    raw = base64.b64decode(key_text[len(prefix):])
    with open(env_path, encoding="utf-8") as f:
        doc = json.load(f)
    envelope = Envelope.from_dict(doc)
    keyids = [s.keyid for s in envelope.signatures.values()]
    key = SSlibKey(keyids[0] if keyids else "none", "ed25519", "ed25519", {"public": raw.hex()})
    out = {"payload_type": envelope.payload_type}
    try:
        envelope.verify([key], 1)
        out["verified"] = True
    except VerificationError as e:
        out["verified"] = False
        out["error"] = str(e)
    statement = json.loads(envelope.payload)
    out["statement_type"] = statement.get("_type")
    out["predicate_type"] = statement.get("predicateType")
    out["subjects"] = len(statement.get("subject", []))
    print(json.dumps(out))
    return 0 if out["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
