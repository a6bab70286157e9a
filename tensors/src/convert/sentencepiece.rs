//! The pieces of a SentencePiece model (`tokenizer.model`): the protobuf `ModelProto` read just far enough for
//! what `SentencePieceProcessor` answers convert_hf_to_gguf (`IdToPiece`, `GetScore`, `IsUnknown`/`IsControl`/
//! `IsUnused`/`IsByte`). Field numbers from sentencepiece's `sentencepiece_model.proto`: `ModelProto.pieces = 1`;
//! `SentencePiece.piece = 1` (string), `score = 2` (float), `type = 3` (enum, default NORMAL). [`write_model`] writes
//! one back from a GGUF's vocabulary: `ModelProto.trainer_spec = 2` (`model_type = 3`, BPE 2; `vocab_size = 4`;
//! `byte_fallback = 35`; `unk_id`..`pad_id` = 40..43) and `normalizer_spec = 3` (`name = 1`, `add_dummy_prefix = 3`,
//! `remove_extra_whitespaces = 4`, `escape_whitespaces = 5`), as sentencepiece_model_pb2 numbers them.

use crate::error::{Error, Result};

/// `SentencePiece.Type`; GGUF's token types use the same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub piece: String,
    pub score: f32,
    pub ty: PieceType,
}

/// A protobuf wire-format reader over one message's bytes.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Wire<'a> {
    fn err(&self, msg: &str) -> Error {
        Error::format(
            self.file,
            "tokenizer.model",
            format!("malformed SentencePiece model at byte {}: {msg}", self.pos),
        )
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(|| self.err("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let end = usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n)).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| self.err("field runs past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next field: its number and value, or None at the end.
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed(self.take(8)?),
            2 => {
                let n = self.varint()?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed(self.take(4)?),
            w => return Err(self.err(&format!("unsupported wire type {w}"))),
        };
        Ok(Some((key >> 3, value)))
    }
}

enum Field<'a> {
    Varint(u64),
    Fixed(&'a [u8]),
    Bytes(&'a [u8]),
}

/// The pieces of a serialized `ModelProto`, in id order. `file` names it in errors.
pub fn pieces(model: &[u8], file: &str) -> Result<Vec<Piece>> {
    let mut top = Wire { buf: model, pos: 0, file };
    let mut out = Vec::new();
    while let Some((num, f)) = top.field()? {
        let (1, Field::Bytes(msg)) = (num, f) else { continue };
        let mut w = Wire { buf: msg, pos: 0, file };
        let (mut piece, mut score, mut ty) = (None, 0.0f32, PieceType::Normal);
        while let Some((num, f)) = w.field()? {
            match (num, f) {
                (1, Field::Bytes(b)) => {
                    piece = Some(String::from_utf8(b.to_vec()).map_err(|_| top.err("a piece is not UTF-8"))?)
                }
                (2, Field::Fixed(b)) if b.len() == 4 => score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                (3, Field::Varint(t)) => {
                    ty = match t {
                        1 => PieceType::Normal,
                        2 => PieceType::Unknown,
                        3 => PieceType::Control,
                        4 => PieceType::UserDefined,
                        5 => PieceType::Unused,
                        6 => PieceType::Byte,
                        _ => return Err(top.err(&format!("piece {} has unknown type {t}", out.len()))),
                    }
                }
                _ => {}
            }
        }
        let piece = piece.ok_or_else(|| top.err(&format!("piece {} has no text", out.len())))?;
        out.push(Piece { piece, score, ty });
    }
    if out.is_empty() {
        return Err(top.err("no pieces"));
    }
    Ok(out)
}

/// What a written model says besides its pieces.
pub struct ModelSpec {
    /// `NormalizerSpec.add_dummy_prefix` (llama.cpp's `add_space_prefix`).
    pub add_dummy_prefix: bool,
    pub unk_id: Option<u32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
}

/// A SentencePiece BPE model of `pieces` (every one with its score and type), as LLaMA's, Mistral's and Gemma's
/// `tokenizer.model` are: byte fallback when it has byte pieces, the identity normalizer escaping whitespace.
pub fn write_model(pieces: &[Piece], spec: &ModelSpec) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        let mut m = Vec::new();
        bytes_field(1, p.piece.as_bytes(), &mut m);
        varint(2 << 3 | 5, &mut m);
        m.extend_from_slice(&p.score.to_le_bytes());
        if p.ty != PieceType::Normal {
            varint(3 << 3, &mut m);
            varint(p.ty as u64, &mut m);
        }
        bytes_field(1, &m, &mut out);
    }
    // int32 fields: a negative value is sign-extended to ten bytes.
    let int = |num: u64, v: i64, out: &mut Vec<u8>| {
        varint(num << 3, out);
        varint(v as u64, out);
    };
    let mut trainer = Vec::new();
    int(3, 2, &mut trainer);
    int(4, pieces.len() as i64, &mut trainer);
    int(35, i64::from(pieces.iter().any(|p| p.ty == PieceType::Byte)), &mut trainer);
    let id = |v: Option<u32>| v.map_or(-1, i64::from);
    int(40, id(spec.unk_id), &mut trainer);
    int(41, id(spec.bos_id), &mut trainer);
    int(42, id(spec.eos_id), &mut trainer);
    int(43, id(spec.pad_id), &mut trainer);
    bytes_field(2, &trainer, &mut out);
    let mut normalizer = Vec::new();
    bytes_field(1, b"identity", &mut normalizer);
    int(3, i64::from(spec.add_dummy_prefix), &mut normalizer);
    int(4, 0, &mut normalizer);
    int(5, 1, &mut normalizer);
    bytes_field(3, &normalizer, &mut out);
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn bytes_field(num: u64, b: &[u8], out: &mut Vec<u8>) {
    varint(num << 3 | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_models_read_back() {
        let ps = vec![
            Piece { piece: "<unk>".into(), score: 0.0, ty: PieceType::Unknown },
            Piece { piece: "<s>".into(), score: 0.0, ty: PieceType::Control },
            Piece { piece: "<0x00>".into(), score: 0.0, ty: PieceType::Byte },
            Piece { piece: "\u{2581}the".into(), score: -3.5, ty: PieceType::Normal },
        ];
        let spec = ModelSpec { add_dummy_prefix: true, unk_id: Some(0), bos_id: Some(1), eos_id: None, pad_id: None };
        assert_eq!(pieces(&write_model(&ps, &spec), "t").unwrap(), ps);
    }

    #[test]
    fn reads_pieces_and_skips_other_fields() {
        let mut p1 = Vec::new();
        bytes_field(1, "<unk>".as_bytes(), &mut p1);
        varint(3 << 3, &mut p1);
        varint(2, &mut p1);
        let mut p2 = Vec::new();
        bytes_field(1, "▁the".as_bytes(), &mut p2);
        varint(2 << 3 | 5, &mut p2);
        p2.extend_from_slice(&(-3.5f32).to_le_bytes());
        let mut model = Vec::new();
        bytes_field(1, &p1, &mut model);
        bytes_field(2, &[8, 1], &mut model); // trainer_spec, skipped
        bytes_field(1, &p2, &mut model);
        let got = pieces(&model, "t").unwrap();
        assert_eq!(got[0], Piece { piece: "<unk>".into(), score: 0.0, ty: PieceType::Unknown });
        assert_eq!(got[1], Piece { piece: "▁the".into(), score: -3.5, ty: PieceType::Normal });
        let e = pieces(&model[..model.len() - 2], "t").unwrap_err().to_string();
        assert!(e.contains("malformed SentencePiece model"), "{e}");
    }
}
