//! llama.cpp's own log, routed through `tracing` at debug level under the target `llama.cpp`.
//!
//! llama.cpp and ggml print through one callback (`llama_log_set` sets ggml's too) in pieces: a line may arrive in
//! several calls, the later ones at `GGML_LOG_LEVEL_CONT`. The pieces are joined here and each whole line becomes
//! one `debug` event carrying llama.cpp's own level as a field. Its warnings (such as "n_ctx is not divisible by
//! n_seq_max") describe choices quantfarm makes on purpose, so they are not a user's concern: the CLI shows them
//! with `-v`, and what goes wrong reaches the user as quantfarm's own error.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;

/// The part of a line not yet ended by a newline, with the level it began at.
static PENDING: Mutex<(String, &str)> = Mutex::new((String::new(), "none"));

/// Installs the callback; llama.cpp keeps it for the life of the process.
pub(crate) fn install() {
    // SAFETY: the callback is a plain function that outlives every llama.cpp call, and takes no user data.
    unsafe { sys::llama_log_set(Some(on_log), std::ptr::null_mut()) };
}

fn level_name(level: sys::ggml_log_level) -> Option<&'static str> {
    Some(match level {
        sys::GGML_LOG_LEVEL_DEBUG => "debug",
        sys::GGML_LOG_LEVEL_INFO => "info",
        sys::GGML_LOG_LEVEL_WARN => "warn",
        sys::GGML_LOG_LEVEL_ERROR => "error",
        sys::GGML_LOG_LEVEL_CONT => return None,
        _ => "none",
    })
}

extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string that lives for the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    // A poisoned lock only means an earlier event panicked in a subscriber: the buffer itself is still a string.
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(name) = level_name(level) {
        if !pending.0.is_empty() {
            // A new message while a line was open: the open one ended without its newline.
            emit(pending.1, &std::mem::take(&mut pending.0));
        }
        pending.1 = name;
    }
    pending.0.push_str(&text);
    while let Some(end) = pending.0.find('\n') {
        let line: String = pending.0.drain(..=end).collect();
        emit(pending.1, line.trim_end());
    }
}

fn emit(level: &str, line: &str) {
    if !line.is_empty() {
        tracing::debug!(target: "llama.cpp", level, "{line}");
    }
}
