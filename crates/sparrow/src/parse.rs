//! Value parsers for the command line: every number a flag takes is checked for its range when it is
//! parsed, so a bad value is a one-line usage error naming the flag, never a NaN or a saturated size
//! inside the engine.

/// Parses `123`, `64K`, `80M`, `1.5G` (powers of 1024), at most 1 PiB (the engine's parser, which the
/// server's live budget uses too).
pub fn size(s: &str) -> Result<u64, String> {
    engine::parse_size(s)
}

/// A finite number in `[lo, hi]`.
fn ranged(s: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() || v < lo || v > hi {
        return Err(format!("`{s}` is outside [{lo}, {hi}]"));
    }
    Ok(v)
}

/// A finite number in `[0, 1]` (shares, probabilities).
pub fn unit(s: &str) -> Result<f64, String> {
    ranged(s, 0.0, 1.0)
}

/// [`unit()`] as f32.
pub fn unit_f32(s: &str) -> Result<f32, String> {
    unit(s).map(|v| v as f32)
}

/// A stop string: not empty (an empty one would end every generation before its first token).
pub fn stop_string(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a stop string cannot be empty".into());
    }
    Ok(s.to_string())
}

/// A temperature: finite, in `[0, 100]`.
pub fn temperature(s: &str) -> Result<f32, String> {
    ranged(s, 0.0, 100.0).map(|v| v as f32)
}

/// A repetition penalty: finite, in `(0, 100]`.
pub fn penalty(s: &str) -> Result<f32, String> {
    let v = ranged(s, 0.0, 100.0)?;
    if v == 0.0 {
        return Err(format!("`{s}` must be above 0 (1: off)"));
    }
    Ok(v as f32)
}

/// One memory budget of a sweep: `40%` (that share of the FFN kept in memory, `--ffn-resident`) or a
/// size (`150M`: the whole process, `--memory-budget`), with the text it was given as.
#[derive(Debug, Clone)]
pub struct SweepBudget {
    /// As given on the command line.
    pub label: String,
    /// The budget.
    pub budget: engine::MemoryBudget,
}

/// Parses one [`SweepBudget`]: a percentage in `(0, 100]` or a size above 0.
pub fn sweep_budget(s: &str) -> Result<SweepBudget, String> {
    let t = s.trim();
    let budget = match t.strip_suffix('%') {
        Some(p) => {
            let v = ranged(p, 0.0, 100.0)?;
            if v == 0.0 {
                return Err(format!("`{s}` must be above 0%"));
            }
            engine::MemoryBudget::Share(v / 100.0)
        }
        None => match size(t)? {
            0 => return Err(format!("`{s}` must be above 0")),
            b => engine::MemoryBudget::Process(b),
        },
    };
    Ok(SweepBudget {
        label: t.to_string(),
        budget,
    })
}

/// A speed in tokens per second: finite, in `(0, 1e6]`.
pub fn positive_f64(s: &str) -> Result<f64, String> {
    let v = ranged(s, 0.0, 1e6)?;
    if v == 0.0 {
        return Err(format!("`{s}` must be above 0"));
    }
    Ok(v)
}

/// A share of the FFN kept in memory: finite, in `(0, 1]`.
pub fn share(s: &str) -> Result<f64, String> {
    let v = unit(s)?;
    if v == 0.0 {
        return Err(format!("`{s}` must be above 0"));
    }
    Ok(v)
}

/// [`share`] as f32.
pub fn share_f32(s: &str) -> Result<f32, String> {
    share(s).map(|v| v as f32)
}

/// An integer in `[lo, hi]`.
fn int_in(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if v < lo || v > hi {
        return Err(format!("`{s}` is outside [{lo}, {hi}]"));
    }
    Ok(v)
}

/// Reads in flight on the I/O thread: 1 to 4096.
pub fn io_depth(s: &str) -> Result<usize, String> {
    int_in(s, 1, 4096)
}

/// A context size in tokens: 0 (the model's) to 1,048,576.
pub fn ctx(s: &str) -> Result<usize, String> {
    int_in(s, 0, 1 << 20)
}

/// A token count: 0 to 1,048,576.
pub fn tokens(s: &str) -> Result<usize, String> {
    int_in(s, 0, 1 << 20)
}

/// A token count of at least one: 1 to 1,048,576.
pub fn some_tokens(s: &str) -> Result<usize, String> {
    int_in(s, 1, 1 << 20)
}

/// Sequences decoded as one batch by `--best-of`: 1 to 64.
pub fn best_of(s: &str) -> Result<usize, String> {
    int_in(s, 1, 64)
}

/// Most tokens drafted per verification step of `--lookup`: 1 to 64.
pub fn lookup(s: &str) -> Result<usize, String> {
    int_in(s, 1, 64)
}

/// A thread count: 0 (one per core) to 1024 (more than the cores is capped with a warning at start).
pub fn threads(s: &str) -> Result<usize, String> {
    int_in(s, 0, 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_not_empty() {
        assert_eq!(stop_string("\n\n"), Ok("\n\n".to_string()));
        assert!(stop_string("").unwrap_err().contains("empty"));
    }

    #[test]
    fn sizes_are_powers_of_1024() {
        assert_eq!(size("123"), Ok(123));
        assert_eq!(size("64K"), Ok(64 << 10));
        assert_eq!(size("80m"), Ok(80 << 20));
        assert_eq!(size(" 1.5G "), Ok(3 << 29));
        assert!(size("x").is_err());
        assert!(size("-1M").is_err());
        assert!(size("nanG").is_err());
        assert!(size("99999999999999999999G").is_err());
    }

    #[test]
    fn ranges_refuse_nan_and_out_of_range() {
        assert_eq!(unit("0.5"), Ok(0.5));
        assert!(unit("1.5").is_err());
        assert!(unit("nan").is_err());
        assert!(unit("-0.5").is_err());
        assert!(temperature("nan").is_err());
        assert!(temperature("inf").is_err());
        assert_eq!(temperature("0.7"), Ok(0.7));
        assert!(penalty("0").is_err());
        assert_eq!(penalty("1.1"), Ok(1.1));
        assert!(share("0").is_err());
        assert!(io_depth("0").is_err());
        assert_eq!(io_depth("256"), Ok(256));
        assert!(threads("5000").is_err());
        assert!(ctx("-1").is_err());
    }

    #[test]
    fn sweep_budgets_are_shares_or_sizes() {
        let b = sweep_budget("40%").unwrap();
        assert_eq!(
            (b.label.as_str(), b.budget),
            ("40%", engine::MemoryBudget::Share(0.4))
        );
        let b = sweep_budget("150M").unwrap();
        assert_eq!(b.budget, engine::MemoryBudget::Process(150 << 20));
        for bad in ["0%", "101%", "nan%", "0", "x", "-5%"] {
            assert!(sweep_budget(bad).is_err(), "{bad}");
        }
    }
}
