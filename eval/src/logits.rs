//! What a step of decoding reads off one position's logits: the greedy choice and how decided it was. Pure
//! functions on `f32` slices, below both the runtime that decodes and the greedy comparison that reports.

/// A token id, as llama.cpp numbers them.
pub type Token = i32;

/// The first index of the largest logit (ties go to the lowest id, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> Token {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > logits[best] {
            best = i;
        }
    }
    best as Token
}

/// Top-1 minus top-2 logit: how decided a greedy choice was.
pub fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > a {
            b = a;
            a = l;
        } else if l > b {
            b = l;
        }
    }
    a - b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_and_margin() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(top2_margin(&[1.0, 3.0, 2.5]), 0.5);
        assert_eq!(top2_margin(&[3.0, 3.0]), 0.0);
    }
}
