//! Chat templates (Jinja, as shipped in GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`), rendered with minijinja.

use std::sync::Arc;

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::TokenizerError;

const TEMPLATE_NAME: &str = "chat_template";

/// Instructions a template may execute in one render (minijinja fuel). Real templates render a long
/// conversation in well under 1% of this; a template that loops without end runs out in about a second.
pub const RENDER_FUEL: u64 = 20_000_000;

/// Bytes a template may write in one render.
pub const RENDER_MAX_BYTES: usize = 16 << 20;

/// The ChatML template used when a model ships none.
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's template (Gemma 3's, as its instruction-tuned models ship it in `tokenizer_config.json`):
/// `<start_of_turn>user\n...<end_of_turn>\n`, "assistant" written as "model", a system message put
/// before the first user message followed by a blank line, contents trimmed; the same text as
/// llama.cpp's built-in "gemma" format for alternating turns.
const GEMMA: &str = "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// Builds a message from a role and its content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
///
/// The environment mimics the one `transformers` uses: `trim_blocks` and `lstrip_blocks`
/// are on, Python string/dict/list methods (`.strip()`, `.items()`, ...) work through
/// `minijinja_contrib::pycompat`, and the functions `raise_exception(msg)` and
/// `strftime_now(fmt)` are available. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct ChatTemplate {
    source: Arc<str>,
    env: Arc<Environment<'static>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC date/time. Supports `%Y %m %d %e %H %M %S %b %B %a
/// %A %y %p %I %j %%`; other directives are copied through.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_unix_time(secs, &fmt)
}

fn format_unix_time(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m - 1) as usize];
    let h12 = if h % 12 == 0 { 12 } else { h % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{h12:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. A syntax error is returned as
    /// [`TokenizerError::Template`] with minijinja's description (kind, message, line).
    pub fn new(source: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        Ok(ChatTemplate {
            source: Arc::from(source),
            env: Arc::new(env),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation into the prompt text.
    ///
    /// The template sees `messages` (list of `{role, content}`), `add_generation_prompt`,
    /// `bos_token` and `eos_token`, like `transformers`' `apply_chat_template`.
    ///
    /// Rendering is bounded: at most `RENDER_FUEL` template instructions, `RENDER_MAX_BYTES` of
    /// output, and (on Linux and Android, where it runs in a child process)
    /// [`crate::RENDER_MAX_MEMORY`] of memory and [`crate::RENDER_TIMEOUT`] of time, past which it
    /// fails with [`TokenizerError::Render`] (a template from a model file is untrusted input).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TokenizerError> {
        crate::sandbox::bounded(|| {
            self.render_in_process(messages, add_generation_prompt, bos_token, eos_token)
        })
    }

    /// [`ChatTemplate::render`] in this process: fuel and the output limit only.
    fn render_in_process(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TokenizerError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Render(describe(&e)))?;
        let mut out = BoundedOutput::default();
        // minijinja 2.24 panics on some inputs (`''[::-1]`: a reversed slice of an empty string
        // indexes past its end; found by the fuzz round): a panic is an error of this template.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tmpl.render_captured_to(
                context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => bos_token,
                    eos_token => eos_token,
                },
                &mut out,
            )
        }))
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            TokenizerError::Render(format!("the template engine failed: {what}"))
        })?;
        match result {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| TokenizerError::Render("output is not UTF-8".into())),
            Err(_) if out.overflowed => Err(TokenizerError::Render(format!(
                "output exceeds {} MiB",
                RENDER_MAX_BYTES >> 20
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(TokenizerError::Render(format!(
                "the template ran past {RENDER_FUEL} instructions (a loop without end?)"
            ))),
            Err(e) => Err(TokenizerError::Render(describe(&e))),
        }
    }

    /// Gemma's template (see `GEMMA` in this file), the fallback for a vocabulary with
    /// `<start_of_turn>` and `<end_of_turn>` tokens that ships no template (the Gemma 3 270M GGUF).
    pub fn gemma() -> ChatTemplate {
        match ChatTemplate::new(GEMMA) {
            Ok(t) => t,
            // The constant is a valid template (covered by tests); this arm is unreachable.
            Err(e) => unreachable!("built-in Gemma template failed to compile: {e}"),
        }
    }

    /// The ChatML template (`<|im_start|>role\ncontent<|im_end|>\n` ...), the fallback
    /// when a model ships no template.
    pub fn chatml() -> ChatTemplate {
        match ChatTemplate::new(CHATML) {
            Ok(t) => t,
            // The constant is a valid template (covered by tests); this arm is unreachable.
            Err(e) => unreachable!("built-in ChatML template failed to compile: {e}"),
        }
    }
}

/// A writer that refuses to grow past [`RENDER_MAX_BYTES`].
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > RENDER_MAX_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// minijinja error text including its detail and source location.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_exactly() {
        let t = ChatTemplate::new(SMOLLM2_TEMPLATE).unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", "Hi")],
                true,
                "<|im_start|>",
                "<|im_end|>",
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        // With a system message the default system prompt is not inserted; no generation prompt.
        let out = t
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                false,
                "",
                "",
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
        assert_eq!(t.source(), SMOLLM2_TEMPLATE);
    }

    #[test]
    fn endless_templates_run_out_of_fuel_or_room() {
        let msgs = [ChatMessage::new("user", "Hi")];
        let t = ChatTemplate::new(
            "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}",
        )
        .unwrap();
        let start = std::time::Instant::now();
        let e = t.render(&msgs, true, "", "").unwrap_err().to_string();
        assert!(e.contains("instructions") || e.contains("MiB"), "{e}");
        assert!(start.elapsed().as_secs() < 30);
        let t =
            ChatTemplate::new("{% for i in range(300) %}{{ 'y' * 100000 }}{% endfor %}").unwrap();
        let e = t.render(&msgs, true, "", "").unwrap_err().to_string();
        assert!(e.contains("exceeds 16 MiB"), "{e}");
        let t = ChatTemplate::new(
            "{% for i in range(9999) %}{% for j in range(9999) %}{% if i < 0 %}z{% endif %}{% endfor %}{% endfor %}",
        )
        .unwrap();
        let e = t.render(&msgs, true, "", "").unwrap_err().to_string();
        assert!(e.contains("instructions"), "{e}");
    }

    #[test]
    fn values_that_double_in_size_are_stopped_by_the_memory_bound() {
        let msgs = [ChatMessage::new("user", "Hi")];
        // 2^40 bytes in 40 concatenations: fuel alone never stops this.
        for source in [
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
            "{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ d('x', 40) }}",
        ] {
            let t = ChatTemplate::new(source).unwrap();
            let e = t.render(&msgs, true, "", "").unwrap_err().to_string();
            if cfg!(any(target_os = "linux", target_os = "android")) {
                assert!(e.contains("MiB of memory"), "{source}: {e}");
            }
        }
        // The same shape within the bound renders, and the caller keeps working afterwards.
        let t = ChatTemplate::new(
            "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        )
        .unwrap();
        assert_eq!(
            t.render(&msgs, true, "", "").unwrap(),
            (1u64 << 20).to_string()
        );
    }

    #[test]
    fn a_render_error_and_large_outputs_come_back_whole() {
        // Larger than a pipe's buffer, so the parent must read while the child writes.
        let t = ChatTemplate::new("{% for i in range(4000) %}{{ 'abcdefgh' * 100 }}{% endfor %}")
            .unwrap();
        let out = t.render(&[], false, "", "").unwrap();
        assert_eq!(out.len(), 3_200_000);
        assert!(out.starts_with("abcdefgh"));
        let t = ChatTemplate::new("{{ raise_exception('no ' ~ 'way') }}").unwrap();
        let e = t.render(&[], false, "", "").unwrap_err();
        assert!(
            matches!(e, TokenizerError::Render(ref m) if m.contains("no way")),
            "{e:?}"
        );
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml();
        let out = t
            .render(
                &[
                    ChatMessage::new("user", "Hi"),
                    ChatMessage::new("assistant", "Hello!"),
                ],
                true,
                "",
                "",
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("chat template"), "{msg}");
        let err = ChatTemplate::new("{{ 'a' + }}").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err:?}");
    }

    #[test]
    fn raise_exception_and_pycompat() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ messages[0]['content'].strip() }}{{ bos_token }}",
        )
        .unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  hi  ")], false, "<s>", "</s>")
                .unwrap(),
            "hi<s>"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false, "", "")
            .unwrap_err();
        assert!(matches!(err, TokenizerError::Render(_)));
        assert!(
            err.to_string()
                .contains("first message must be from the user"),
            "{err}"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let t = ChatTemplate::new(
            "{% for message in messages %}\n    {{ message.content }}\n{% endfor %}\n",
        )
        .unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
                "",
                "",
            )
            .unwrap();
        assert_eq!(out, "    a\n    b\n");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-23 13:05:09 UTC, a Tuesday.
        assert_eq!(
            format_unix_time(1_721_739_909, "%d %b %Y %H:%M:%S %A %j %%"),
            "23 Jul 2024 13:05:09 Tuesday 205 %"
        );
        assert_eq!(format_unix_time(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
        let t = ChatTemplate::new("{{ strftime_now('%Y') | length }}").unwrap();
        assert_eq!(t.render(&[], false, "", "").unwrap(), "4");
    }

    #[test]
    fn chat_message_serde() {
        let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"Hi"}"#).unwrap();
        assert_eq!(m, ChatMessage::new("user", "Hi"));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"role":"user","content":"Hi"}"#
        );
    }

    /// Regression (fuzz round, issue 19): minijinja panicked reversing an empty string
    /// (`''[::-1]`, here an empty message); rendering returns an error instead.
    #[test]
    fn reversing_an_empty_string_is_an_error_not_a_panic() {
        let t =
            ChatTemplate::new("{% for m in messages %}{{ m.content[::-1] }}{% endfor %}").unwrap();
        let full = t.render(&[ChatMessage::new("user", "ab")], false, "", "");
        assert_eq!(full.unwrap(), "ba");
        let empty = t.render(&[ChatMessage::new("assistant", "")], false, "", "");
        assert!(matches!(empty, Err(TokenizerError::Render(_))), "{empty:?}");
    }
}
