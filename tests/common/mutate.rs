//! Seeded mutations of valid files, for the tests that feed loaders bad input, and the largest
//! allocation a loader makes while it reads one.
//!
//! The binary that includes this file gets a global allocator that records the largest single
//! request and refuses (a null pointer, which stops the process with the size) any request
//! above 4 GiB, so that an input whose declared sizes a loader trusts shows up as a failure and
//! not as a machine out of memory.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;

/// Requests above this are refused outright.
const REFUSE_ABOVE: usize = 1 << 32;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Tracking;

fn note(size: usize) -> bool {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    size <= REFUSE_ABOVE
}

// SAFETY: every call is forwarded to the system allocator unchanged, or refused with null
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f` and returns its result with the largest single allocation made meanwhile (by any
/// thread: the callers serialise the loads they measure).
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.store(0, Ordering::Relaxed);
    let out = f();
    (out, LARGEST.load(Ordering::Relaxed))
}

/// Integers that break size, length and offset fields.
pub const INTEGERS: [u64; 10] = [
    0,
    1,
    0xFF,
    0xFFFF,
    0xFFFF_FFFF,
    1 << 31,
    1 << 40,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
];

/// One random mutation of `data`: flipped bits, bytes set to delimiters or extremes, a
/// truncation, a deleted or duplicated range, or eight bytes overwritten with one of
/// [`INTEGERS`].
pub fn mutate_bytes(rng: &mut StdRng, data: &[u8]) -> Vec<u8> {
    let mut d = data.to_vec();
    if d.is_empty() {
        return d;
    }
    let at = |rng: &mut StdRng, len: usize| rng.random_range(0..len);
    match rng.random_range(0..6) {
        0 => {
            for _ in 0..rng.random_range(1..=8) {
                let i = at(rng, d.len());
                d[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            const BYTES: &[u8] = b"\x00\xff\x7f\x80\"{}[],:9-.e\n\r ";
            for _ in 0..rng.random_range(1..=4) {
                let i = at(rng, d.len());
                d[i] = *BYTES.choose(rng).unwrap();
            }
        }
        2 => d.truncate(at(rng, d.len())),
        3 => {
            let start = at(rng, d.len());
            let end = (start + rng.random_range(1..=64)).min(d.len());
            d.drain(start..end);
        }
        4 => {
            let start = at(rng, d.len());
            let end = (start + rng.random_range(1..=64)).min(d.len());
            let copy: Vec<u8> = d[start..end].to_vec();
            let to = at(rng, d.len());
            d.splice(to..to, copy);
        }
        _ => {
            let v = INTEGERS.choose(rng).unwrap().to_le_bytes();
            let i = at(rng, d.len());
            let n = (d.len() - i).min(8);
            d[i..i + n].copy_from_slice(&v[..n]);
        }
    }
    d
}

/// Values that a JSON or CSV number field should refuse or survive.
const TOKENS: [&str; 20] = [
    "0",
    "-1",
    "1.5",
    "1e308",
    "1e400",
    "-1e400",
    "18446744073709551615",
    "18446744073709551616",
    "9007199254740993",
    "4294967296",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "\"x\"",
    "[]",
    "{}",
    "",
    "1,2",
];

/// `text` with one of its number tokens (a run of digits, signs, dots and exponents) replaced
/// by a value from a list of extremes, non-numbers and wrong types.
pub fn mutate_number(rng: &mut StdRng, text: &str) -> String {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
            {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    let Some(&(start, end)) = spans.choose(rng) else {
        return text.to_string();
    };
    format!(
        "{}{}{}",
        &text[..start],
        TOKENS.choose(rng).unwrap(),
        &text[end..]
    )
}

/// What a run of one target saw.
#[derive(Default, Debug)]
pub struct Tally {
    pub inputs: usize,
    pub accepted: usize,
    pub refused: usize,
}

/// Runs `load` on input `index` of `target`: it must return, not panic; an error must name one
/// of the files `names`; no single allocation may exceed `bound` bytes.
pub fn check<T, E: std::fmt::Display>(
    tally: &mut Tally,
    target: &str,
    index: usize,
    names: &[&str],
    bound: usize,
    load: impl FnOnce() -> Result<T, E>,
) -> Option<T> {
    let (result, largest) = largest_allocation(|| catch_unwind(AssertUnwindSafe(load)));
    assert!(
        largest <= bound,
        "{target} input {index}: an allocation of {largest} bytes (at most {bound})"
    );
    tally.inputs += 1;
    match result {
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target} input {index} panicked: {message}");
        }
        Ok(Ok(value)) => {
            tally.accepted += 1;
            Some(value)
        }
        Ok(Err(e)) => {
            let message = e.to_string();
            assert!(
                names.iter().any(|name| message.contains(name)),
                "{target} input {index}: the error names none of {names:?}: {message}"
            );
            tally.refused += 1;
            None
        }
    }
}
