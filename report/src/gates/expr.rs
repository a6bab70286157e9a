//! A gate's check: a comparison of sums of measured figures and numbers (`q4_k_m.kld.mean <= 0.05`,
//! `probe.pass_rate >= baseline - noise`), or one yes/no figure alone (`verified`).
//!
//! The language is deliberately tiny — no functions, no boolean operators — so that a check reads as the sentence a
//! person would write and its result can be printed with every input it used. Unknown figure names are refused when
//! the release is submitted ([`Check::parse`] with the list of known names), not when the gate is evaluated.

use std::fmt;

/// A parsed check; `Display` prints it back in canonical spacing.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// A yes/no figure (`verified`).
    Flag(String),
    Compare {
        left: Sum,
        op: Op,
        right: Sum,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Le,
    Ge,
    Lt,
    Gt,
}

impl Op {
    fn holds(self, l: f64, r: f64) -> bool {
        match self {
            Op::Le => l <= r,
            Op::Ge => l >= r,
            Op::Lt => l < r,
            Op::Gt => l > r,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Le => "<=",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Gt => ">",
        }
    }

    /// The operator that does not hold when this one fails, for printing a failed comparison.
    fn negated(self) -> &'static str {
        match self {
            Op::Le => ">",
            Op::Ge => "<",
            Op::Lt => ">=",
            Op::Gt => "<=",
        }
    }
}

/// Terms added or subtracted left to right.
#[derive(Clone, Debug, PartialEq)]
pub struct Sum(pub Vec<(f64, Term)>);

#[derive(Clone, Debug, PartialEq)]
pub enum Term {
    Number(f64),
    Figure(String),
}

/// What a check needs to be evaluated: the value of each figure it names, or why there is none.
pub trait Figures {
    fn number(&self, name: &str) -> Result<f64, String>;
    fn flag(&self, name: &str) -> Result<bool, String>;
}

/// A check's outcome: whether it holds, every figure it read, and one line that says why.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub passed: bool,
    pub inputs: Vec<(String, FigureValue)>,
    /// The right-hand side's value (the threshold), for a comparison that could be evaluated.
    pub threshold: Option<f64>,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FigureValue {
    Number(f64),
    Flag(bool),
    /// Not measured, and why.
    Missing(String),
}

impl Check {
    /// Parses `text`; `known(name)` says whether a figure name exists (a typo is an error here, not a gate that
    /// can never pass).
    pub fn parse(text: &str, known: impl Fn(&str) -> bool) -> Result<Check, String> {
        let tokens = lex(text)?;
        let mut p = Parser { tokens: &tokens, pos: 0 };
        let check = p.check()?;
        if p.pos != tokens.len() {
            return Err(format!("unexpected {} after the check", tokens[p.pos]));
        }
        for name in check.figures() {
            if !known(name) {
                return Err(format!("unknown figure {name:?}"));
            }
        }
        Ok(check)
    }

    /// The figure names it reads, in order of appearance.
    pub fn figures(&self) -> Vec<&str> {
        match self {
            Check::Flag(f) => vec![f.as_str()],
            Check::Compare { left, right, .. } => left
                .0
                .iter()
                .chain(&right.0)
                .filter_map(|(_, t)| match t {
                    Term::Figure(f) => Some(f.as_str()),
                    Term::Number(_) => None,
                })
                .collect(),
        }
    }

    pub fn evaluate(&self, figures: &dyn Figures) -> Outcome {
        match self {
            Check::Flag(name) => match figures.flag(name) {
                Ok(v) => Outcome {
                    passed: v,
                    inputs: vec![(name.clone(), FigureValue::Flag(v))],
                    threshold: None,
                    detail: format!("{name} is {}", if v { "true" } else { "false" }),
                },
                Err(why) => Outcome {
                    passed: false,
                    inputs: vec![(name.clone(), FigureValue::Missing(why.clone()))],
                    threshold: None,
                    detail: format!("{name}: not measured ({why}), and what is not measured never passes"),
                },
            },
            Check::Compare { left, op, right } => {
                let mut inputs = Vec::new();
                let mut missing = Vec::new();
                let mut sum = |s: &Sum| -> Option<f64> {
                    let mut total = 0.0;
                    let mut ok = true;
                    for (sign, term) in &s.0 {
                        let v = match term {
                            Term::Number(n) => Ok(*n),
                            Term::Figure(name) => {
                                let v = figures.number(name);
                                match &v {
                                    Ok(x) => inputs.push((name.clone(), FigureValue::Number(*x))),
                                    Err(why) => {
                                        inputs.push((name.clone(), FigureValue::Missing(why.clone())));
                                        missing.push(format!("{name} ({why})"));
                                    }
                                }
                                v
                            }
                        };
                        match v {
                            Ok(x) => total += sign * x,
                            Err(_) => ok = false,
                        }
                    }
                    ok.then_some(total)
                };
                let (l, r) = (sum(left), sum(right));
                match (l, r) {
                    (Some(l), Some(r)) => {
                        // NaN compares false either way: a figure that is not a number never passes.
                        let passed = op.holds(l, r);
                        let shown = if passed { op.as_str() } else { op.negated() };
                        Outcome {
                            passed,
                            inputs,
                            threshold: Some(r),
                            detail: format!("{} {shown} {}", left.shown(l), right.shown(r)),
                        }
                    }
                    _ => Outcome {
                        passed: false,
                        inputs,
                        threshold: r,
                        detail: format!("not measured: {}; what is not measured never passes", missing.join(", ")),
                    },
                }
            }
        }
    }
}

/// Numbers as people read them in a gate line: up to 6 significant decimals, no trailing zeros.
pub fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let digits = if v.abs() >= 1.0 { 6 } else { (6.0 - v.abs().log10().floor()).clamp(6.0, 12.0) as usize };
    let s = format!("{v:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::Flag(name) => f.write_str(name),
            Check::Compare { left, op, right } => write!(f, "{left} {} {right}", op.as_str()),
        }
    }
}

impl Sum {
    /// The sum with its value (`baseline - noise = 0.625`), or the number alone when it is one.
    fn shown(&self, value: f64) -> String {
        match self.0.as_slice() {
            [(_, Term::Number(_))] => fmt_num(value),
            _ => format!("{self} = {}", fmt_num(value)),
        }
    }
}

impl fmt::Display for Sum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (sign, term)) in self.0.iter().enumerate() {
            match (i, *sign < 0.0) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            match term {
                Term::Number(n) => f.write_str(&fmt_num(*n))?,
                Term::Figure(name) => f.write_str(name)?,
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    Number(f64),
    Plus,
    Minus,
    Op(Op),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Name(n) => write!(f, "{n:?}"),
            Token::Number(n) => write!(f, "{n}"),
            Token::Plus => f.write_str("'+'"),
            Token::Minus => f.write_str("'-'"),
            Token::Op(o) => write!(f, "'{}'", o.as_str()),
        }
    }
}

fn lex(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => i += 1,
            '+' => {
                out.push(Token::Plus);
                i += 1;
            }
            '-' => {
                out.push(Token::Minus);
                i += 1;
            }
            '<' | '>' => {
                let eq = chars.get(i + 1) == Some(&'=');
                out.push(Token::Op(match (c, eq) {
                    ('<', true) => Op::Le,
                    ('<', false) => Op::Lt,
                    ('>', true) => Op::Ge,
                    _ => Op::Gt,
                }));
                i += 1 + eq as usize;
            }
            c if c.is_ascii_digit() || c == '.' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == 'e' || chars[i] == 'E')
                {
                    // An exponent's sign belongs to the number.
                    if (chars[i] == 'e' || chars[i] == 'E') && matches!(chars.get(i + 1), Some('-' | '+')) {
                        i += 1;
                    }
                    i += 1;
                }
                let s: String = chars[start..i].iter().collect();
                let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
                if !v.is_finite() {
                    return Err(format!("{s:?} is not a finite number"));
                }
                out.push(Token::Number(v));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                    i += 1;
                }
                let s: String = chars[start..i].iter().collect();
                if s.ends_with('.') || s.contains("..") {
                    return Err(format!("{s:?} is not a figure name (dot-separated words)"));
                }
                out.push(Token::Name(s.to_ascii_lowercase()));
            }
            '=' if chars.get(i + 1) == Some(&'=') => {
                return Err("'==' is not a check: compare with <=, >=, < or >".into())
            }
            c => return Err(format!("unexpected character {c:?}")),
        }
    }
    if out.is_empty() {
        return Err("the check is empty".into());
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
}

impl Parser<'_> {
    fn check(&mut self) -> Result<Check, String> {
        if let [Token::Name(n)] = self.tokens {
            self.pos = 1;
            return Ok(Check::Flag(n.clone()));
        }
        let left = self.sum()?;
        let op = match self.tokens.get(self.pos) {
            Some(Token::Op(o)) => *o,
            Some(t) => return Err(format!("expected a comparison (<=, >=, <, >), found {t}")),
            None => return Err("expected a comparison (<=, >=, <, >) and a right-hand side".into()),
        };
        self.pos += 1;
        if self.pos == self.tokens.len() {
            return Err(format!("expected a right-hand side after '{}'", op.as_str()));
        }
        let right = self.sum()?;
        Ok(Check::Compare { left, op, right })
    }

    fn sum(&mut self) -> Result<Sum, String> {
        let mut terms = Vec::new();
        let mut sign = 1.0;
        if self.tokens.get(self.pos) == Some(&Token::Minus) {
            sign = -1.0;
            self.pos += 1;
        }
        loop {
            let term = match self.tokens.get(self.pos) {
                Some(Token::Number(n)) => Term::Number(*n),
                Some(Token::Name(n)) => Term::Figure(n.clone()),
                Some(t) => return Err(format!("expected a figure or a number, found {t}")),
                None => return Err("expected a figure or a number at the end".into()),
            };
            self.pos += 1;
            terms.push((sign, term));
            sign = match self.tokens.get(self.pos) {
                Some(Token::Plus) => 1.0,
                Some(Token::Minus) => -1.0,
                _ => return Ok(Sum(terms)),
            };
            self.pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Map(BTreeMap<&'static str, f64>);

    impl Figures for Map {
        fn number(&self, name: &str) -> Result<f64, String> {
            self.0.get(name).copied().ok_or_else(|| "no kld task ran".to_string())
        }
        fn flag(&self, name: &str) -> Result<bool, String> {
            self.number(name).map(|v| v != 0.0)
        }
    }

    fn any(_: &str) -> bool {
        true
    }

    #[test]
    fn parses_and_prints_back() {
        for (text, canon) in [
            ("q4_k_m.kld.mean <= 0.05", "q4_k_m.kld.mean <= 0.05"),
            ("Q4_K_M.kld.mean<=5e-2", "q4_k_m.kld.mean <= 0.05"),
            ("probe.pass_rate >= baseline - noise", "probe.pass_rate >= baseline - noise"),
            ("-a + 1 > b-2", "-a + 1 > b - 2"),
            ("verified", "verified"),
        ] {
            assert_eq!(Check::parse(text, any).unwrap().to_string(), canon, "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_check() {
        for (text, want) in [
            ("", "empty"),
            ("a <=", "right-hand side"),
            ("a b", "comparison"),
            ("a == 1", "'=='"),
            ("a <= 1 <= 2", "unexpected"),
            ("a <= 1 +", "end"),
            ("kld..mean <= 1", "not a figure name"),
            ("a <= 1e999", "finite"),
            ("a ? 1", "unexpected character"),
        ] {
            let e = Check::parse(text, any).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = Check::parse("q4_k_m.kld.maen <= 1", |n| n == "q4_k_m.kld.mean").unwrap_err();
        assert!(e.contains("unknown figure \"q4_k_m.kld.maen\""), "{e}");
    }

    #[test]
    fn evaluates_with_inputs_and_threshold() {
        let f = Map(BTreeMap::from([("pass", 0.5), ("baseline", 0.75), ("noise", 0.125), ("m", 0.0635)]));
        let c = Check::parse("pass >= baseline - noise", any).unwrap();
        let o = c.evaluate(&f);
        assert!(!o.passed);
        assert_eq!(o.threshold, Some(0.625));
        assert_eq!(o.inputs.len(), 3);
        assert_eq!(o.detail, "pass = 0.5 < baseline - noise = 0.625");
        let o = Check::parse("m <= 0.1", any).unwrap().evaluate(&f);
        assert!(o.passed);
        assert_eq!(o.detail, "m = 0.0635 <= 0.1");
    }

    #[test]
    fn a_missing_figure_fails_and_says_why() {
        let f = Map(BTreeMap::from([("a", 1.0)]));
        let o = Check::parse("a <= b", any).unwrap().evaluate(&f);
        assert!(!o.passed);
        assert!(o.detail.contains("not measured: b (no kld task ran)"), "{}", o.detail);
        assert_eq!(o.inputs[1], ("b".into(), FigureValue::Missing("no kld task ran".into())));
        let o = Check::parse("b", any).unwrap().evaluate(&f);
        assert!(!o.passed);
    }

    #[test]
    fn nan_never_passes() {
        let f = Map(BTreeMap::from([("a", f64::NAN)]));
        assert!(!Check::parse("a <= 1", any).unwrap().evaluate(&f).passed);
        assert!(!Check::parse("a >= 1", any).unwrap().evaluate(&f).passed);
    }
}
