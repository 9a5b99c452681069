//! What LLM calls cost: the price table (defaults the operator overrides with `FLEET_PRICES`),
//! each reply's tokens billed by kind (Anthropic's cache writes and reads at their prices), and
//! how many output tokens a dollar amount buys (the clamp of `max_tokens` to a budget).
//!
//! Closed by default: a model without a price has no cost here (`PriceTable::price` is
//! `None`); submission refuses it and `post_with_retry` never sends a call for it, so no call
//! is ever counted as $0.

use serde_json::Value;
use std::collections::BTreeMap;
use tracing::warn;

/// The highest price per million tokens a table accepts (USD): past it a price is a typo, and
/// a cost could overflow to infinity, which JSON cannot carry.
pub const MAX_PRICE: f64 = 1_000_000.0;

/// When the default prices were read, and from where.
pub const PRICES_READ: &str = "2026-11-29, from stored copies of the providers' pricing pages \
found through search; entries marked third-party were read from pages quoting the providers";

/// A model's prices in USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Anthropic's prompt-cache writes (5-minute cache: 1.25 × input on Anthropic's page).
    pub cache_write: f64,
    /// Anthropic's prompt-cache reads (0.1 × input on Anthropic's page).
    pub cache_read: f64,
}

impl Price {
    /// Input and output prices, the cache priced by Anthropic's documented multipliers.
    pub const fn new(input: f64, output: f64) -> Price {
        Price {
            input,
            output,
            cache_write: input * 1.25,
            cache_read: input * 0.1,
        }
    }

    /// What one reply's tokens cost.
    pub fn cost(&self, t: &Billed) -> f64 {
        (t.input as f64 * self.input
            + t.output as f64 * self.output
            + t.cache_write as f64 * self.cache_write
            + t.cache_read as f64 * self.cache_read)
            / 1_000_000.0
    }

    /// The most output tokens `usd` pays for (0 when nothing is left; all when output is free).
    pub fn output_tokens_for(&self, usd: f64) -> u64 {
        if !usd.is_finite() || usd <= 0.0 {
            return 0;
        }
        if self.output <= 0.0 {
            return u64::MAX;
        }
        // A millionth of a token of slack, for dollar sums that lost their last bit
        // (0.015 - 0.008 is 0.006999…): never a whole token more than is paid for.
        (usd * 1_000_000.0 / self.output + 1e-6)
            .floor()
            .min(u64::MAX as f64) as u64
    }
}

/// One reply's tokens by how they are billed (Anthropic reports cache writes and reads apart
/// from `input_tokens`; OpenAI's cached tokens are inside `prompt_tokens` and billed here at
/// the full input price, which overcounts rather than under).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Billed {
    pub input: u64,
    pub output: u64,
    pub cache_write: u64,
    pub cache_read: u64,
}

impl Billed {
    /// The tokens a reply body of either wire format reports (0 where it says none).
    pub fn of_reply(reply: &Value) -> Billed {
        let u = &reply["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        Billed {
            input: u["input_tokens"].as_u64().unwrap_or(n("prompt_tokens")),
            output: u["output_tokens"]
                .as_u64()
                .unwrap_or(n("completion_tokens")),
            cache_write: n("cache_creation_input_tokens"),
            cache_read: n("cache_read_input_tokens"),
        }
    }
}

/// Where a default price was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriceSource {
    /// The provider's own page (a stored copy of it): Anthropic's pricing page or its models
    /// overview.
    Provider,
    /// A third-party page quoting the provider, not checked against the provider's own page.
    ThirdParty,
}

use PriceSource::{Provider, ThirdParty};

/// The default table: model, input and output USD per million tokens, and where each was read
/// (`PRICES_READ` says when). Anthropic's page (docs.anthropic.com/en/docs/about-claude/pricing,
/// stored copy): Opus 4.1 / 4 $15 / $75, Sonnet 4 / 3.7 $3 / $15, Haiku 3.5 $0.80 / $4, Haiku 3
/// $0.25 / $1.25, cache writes 1.25 × and reads 0.1 × input; Haiku 4.5 $1 / $5 (Anthropic's
/// models overview, stored copy). Third-party (pages quoting the provider, unverified against
/// its own page): Sonnet 4.5, Opus 4.5, and every OpenAI price (openai.com/api/pricing was not
/// read here). `FLEET_PRICES` overrides any row.
pub const DEFAULTS: &[(&str, f64, f64, PriceSource)] = &[
    ("claude-opus-4-5", 5.0, 25.0, ThirdParty),
    ("claude-opus-4-1", 15.0, 75.0, Provider),
    ("claude-opus-4-0", 15.0, 75.0, Provider),
    ("claude-opus-4", 15.0, 75.0, Provider),
    ("claude-sonnet-4-5", 3.0, 15.0, ThirdParty),
    ("claude-sonnet-4-0", 3.0, 15.0, Provider),
    ("claude-sonnet-4", 3.0, 15.0, Provider),
    ("claude-3-7-sonnet", 3.0, 15.0, Provider),
    ("claude-haiku-4-5", 1.0, 5.0, Provider),
    ("claude-3-5-haiku", 0.8, 4.0, Provider),
    ("claude-3-haiku", 0.25, 1.25, Provider),
    ("gpt-4o", 2.5, 10.0, ThirdParty),
    ("gpt-4o-mini", 0.15, 0.6, ThirdParty),
    ("gpt-4.1", 2.0, 8.0, ThirdParty),
    ("gpt-4.1-mini", 0.4, 1.6, ThirdParty),
    ("gpt-4.1-nano", 0.1, 0.4, ThirdParty),
    ("gpt-5", 1.25, 10.0, ThirdParty),
    ("gpt-5-mini", 0.25, 2.0, ThirdParty),
    ("gpt-5-nano", 0.05, 0.4, ThirdParty),
    ("o3", 2.0, 8.0, ThirdParty),
    ("o3-mini", 1.1, 4.4, ThirdParty),
    ("o4-mini", 1.1, 4.4, ThirdParty),
];

/// Prices by model name; a name prices itself and its dated snapshots (`claude-haiku-4-5`
/// prices `claude-haiku-4-5-20251001`, `gpt-4o` prices `gpt-4o-2024-08-06`), never another
/// model (`gpt-5` does not price `gpt-5.4` nor `gpt-5-pro`).
#[derive(Clone, Debug, Default)]
pub struct PriceTable(pub BTreeMap<String, Price>);

impl PriceTable {
    pub fn with_defaults() -> Self {
        Self(
            DEFAULTS
                .iter()
                .map(|(m, i, o, _)| (m.to_string(), Price::new(*i, *o)))
                .collect(),
        )
    }

    /// The defaults with the operator's `FLEET_PRICES` over them.
    pub fn from_env() -> Result<Self, String> {
        let mut t = Self::with_defaults();
        if let Some(extra) = std::env::var("FLEET_PRICES").ok().filter(|v| !v.is_empty()) {
            t.extend_from_json(&extra)?;
        }
        Ok(t)
    }

    /// Adds or replaces entries from JSON `{"model": [input, output]}` or `{"model": [input,
    /// output, cache_write, cache_read]}` (USD per million tokens). Prices are between 0 and
    /// `MAX_PRICE`, so every cost is a finite, non-negative number.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), String> {
        let extra: BTreeMap<String, Vec<f64>> =
            serde_json::from_str(json).map_err(|e| format!("bad price table: {e}"))?;
        let mut parsed = BTreeMap::new();
        for (model, p) in extra {
            if p.iter().any(|x| !(0.0..=MAX_PRICE).contains(x)) {
                return Err(format!(
                    "bad price table: `{model}` costs {p:?}; prices are between 0 and {MAX_PRICE} USD per million tokens"
                ));
            }
            let price = match p[..] {
                [i, o] => Price::new(i, o),
                [i, o, w, r] => Price {
                    input: i,
                    output: o,
                    cache_write: w,
                    cache_read: r,
                },
                _ => {
                    return Err(format!(
                        "bad price table: `{model}` needs [input, output] or [input, output, cache_write, cache_read]"
                    ))
                }
            };
            parsed.insert(model, price);
        }
        self.0.extend(parsed);
        Ok(())
    }

    /// The price of `model`: its own entry, or the longest entry it is a dated snapshot of
    /// (the name, `-`, then a date: at least 8 digits, and dashes; or `-latest`).
    pub fn price(&self, model: &str) -> Option<Price> {
        self.0
            .iter()
            .filter(|(k, _)| {
                model == k.as_str()
                    || model.strip_prefix(k.as_str()).is_some_and(|rest| {
                        rest.strip_prefix('-').is_some_and(|s| {
                            s == "latest"
                                || (s.bytes().filter(u8::is_ascii_digit).count() >= 8
                                    && s.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
                        })
                    })
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(_, p)| *p)
    }

    /// Cost of a call of input and output tokens only (the gateway's count). A model without
    /// a price is never called (see the module's note), so its 0 here is never spent.
    pub fn cost(&self, model: &str, input_tokens: u64, output_tokens: u64) -> f64 {
        let billed = Billed {
            input: input_tokens,
            output: output_tokens,
            ..Billed::default()
        };
        match self.price(model) {
            Some(p) => p.cost(&billed),
            None => {
                warn!(model, "no price for this model");
                0.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn current_models_are_priced_and_snapshots_take_their_models_price() {
        let t = PriceTable::with_defaults();
        for m in [
            "claude-haiku-4-5",
            "claude-haiku-4-5-20251001",
            "claude-sonnet-4-5-20250929",
            "claude-opus-4-1",
            "claude-3-5-haiku-latest",
            "gpt-4o-mini-2024-07-18",
            "gpt-5-mini",
        ] {
            assert!(t.price(m).is_some(), "{m}");
        }
        assert_eq!(t.price("claude-haiku-4-5").unwrap().input, 1.0);
        assert_eq!(t.price("claude-opus-4-1-20250805").unwrap().output, 75.0);
        // Not another model's price: unknown, a point release, another tier.
        for m in [
            "unknown",
            "gpt-5.4",
            "gpt-5-pro",
            "claude-haiku-4-5x",
            "gpt-4o-",
            "claude-opus-4-6",
        ] {
            assert!(t.price(m).is_none(), "{m}");
        }
    }

    #[test]
    fn anthropic_cache_writes_and_reads_are_billed_at_their_prices() {
        let t = PriceTable::with_defaults();
        let p = t.price("claude-sonnet-4-5").unwrap();
        let reply = json!({"usage": {"input_tokens": 1_000_000, "output_tokens": 1_000_000,
            "cache_creation_input_tokens": 1_000_000, "cache_read_input_tokens": 1_000_000}});
        let billed = Billed::of_reply(&reply);
        assert_eq!(billed.cache_write, 1_000_000);
        // $3 input + $15 output + $3.75 cache writes + $0.30 cache reads.
        assert!(
            (p.cost(&billed) - 22.05).abs() < 1e-9,
            "{}",
            p.cost(&billed)
        );
        let openai =
            Billed::of_reply(&json!({"usage": {"prompt_tokens": 7, "completion_tokens": 3}}));
        assert_eq!((openai.input, openai.output), (7, 3));
    }

    #[test]
    fn the_operator_overrides_and_adds_prices() {
        let mut t = PriceTable::with_defaults();
        t.extend_from_json(r#"{"claude-haiku-4-5": [2.0, 4.0], "my-model": [1, 2, 3, 4]}"#)
            .unwrap();
        assert_eq!(t.price("claude-haiku-4-5").unwrap().output, 4.0);
        assert_eq!(t.price("my-model").unwrap().cache_read, 4.0);
        assert!(t.extend_from_json(r#"{"m": [1.0]}"#).is_err());
        assert!(t.extend_from_json(r#"{"m": [-1.0, 1.0]}"#).is_err());
    }

    #[test]
    fn a_dollar_amount_buys_whole_output_tokens() {
        let p = Price::new(1.0, 5.0);
        assert_eq!(p.output_tokens_for(0.001), 200);
        assert_eq!(p.output_tokens_for(0.0), 0);
        assert_eq!(p.output_tokens_for(-1.0), 0);
        assert_eq!(p.output_tokens_for(f64::NAN), 0);
        assert_eq!(Price::new(1.0, 0.0).output_tokens_for(1.0), u64::MAX);
    }
}
