//! Market data from Databento DBN files (`.dbn`, `.dbn.zst`; DBN versions 1 to 3), turned into
//! per-instrument feature series on a fixed time grid (feature `dbn`).
//!
//! Supported schemas: **MBP-1** (top of book with its trades), **trades**, and **OHLCV** bars
//! (`ohlcv-1s`, `-1m`, `-1h`, `-1d`). Several files may be combined (say an MBP-1 file and a
//! trades file of the same day): their records are merged per instrument by event time.
//!
//! # Features
//!
//! For every instrument, the time from its first record to its last is cut into intervals of
//! `interval_ns` nanoseconds (aligned to multiples of the interval). Row `k` describes the
//! interval `[t_k, t_k + interval)` and has, in this column order:
//!
//! | column | definition |
//! |---|---|
//! | `return` | `ln(ref_k / ref_{k-1})`: log return of the reference price over the interval; the reference price is the last mid price `(bid + ask) / 2` at or before the interval's end (MBP-1), else the last trade price (trades), else the last bar close (OHLCV); 0 when it did not change |
//! | `spread` | `(ask - bid) / mid` of the last quote at or before the interval's end (MBP-1); for OHLCV the last bar's range `(high - low) / close`; 0 when neither is known |
//! | `imbalance` | top-of-book imbalance `(bid_size - ask_size) / (bid_size + ask_size)` of the last quote, in `[-1, 1]` (MBP-1; 0 otherwise) |
//! | `volume` | `ln(1 + traded size in the interval)`: trades, MBP-1 trade events, or bar volume |
//! | `trades` | `ln(1 + number of trades in the interval)` (0 for OHLCV, which does not count them) |
//! | `direction` | `sign(return)`: -1, 0 or 1 |
//!
//! Rows start at the first interval whose previous interval already had a reference price.
//! The first five columns are the model inputs ([`MARKET_FEATURES`]); the target of a window is
//! the next row's `return` (regression) or `direction` (its sign, classification). Cut windows
//! of `[seq_len, 5]` inputs with [`super::timeseries::ForecastData`] and horizon
//! 1 (see [`market_windows`]).
//!
//! Prices with Databento's undefined-price sentinel and quotes with a crossed or one-sided book
//! are skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dbn::decode::{DbnMetadata, DecodeRecordRef};
use dbn::{Mbp1Msg, OhlcvMsg, Schema, TradeMsg, VersionUpgradePolicy, UNDEF_PRICE};

use super::timeseries::{ForecastData, Split, TimeSeries};
use crate::error::Mamba2Error;

/// The feature columns, in order (the model inputs).
pub const MARKET_FEATURES: [&str; 5] = ["return", "spread", "imbalance", "volume", "trades"];

/// Most grid rows one instrument may produce (a guard against a tiny interval over a long
/// span).
pub const MAX_GRID_ROWS: u64 = 50_000_000;

/// What a window predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarketTarget {
    /// The next interval's log return (regression).
    Return,
    /// The sign of the next interval's log return, -1, 0 or 1 (classification).
    Direction,
}

impl MarketTarget {
    fn column(self) -> &'static str {
        match self {
            MarketTarget::Return => "return",
            MarketTarget::Direction => "direction",
        }
    }
}

/// One decoded event, in float prices.
#[derive(Clone, Copy, Debug)]
enum Event {
    Quote {
        bid: f64,
        ask: f64,
        bid_size: f64,
        ask_size: f64,
    },
    Trade {
        price: f64,
        size: f64,
    },
    Bar {
        close: f64,
        high: f64,
        low: f64,
        volume: f64,
    },
}

fn price(p: i64) -> Option<f64> {
    (p != UNDEF_PRICE && p > 0).then(|| p as f64 / dbn::FIXED_PRICE_SCALE as f64)
}

/// The record types a file of `schema` may hold: its own, and the control records (symbol
/// mappings, system and error messages).
fn allowed_rtypes(schema: Schema) -> &'static [u8] {
    use dbn::rtype::*;
    match schema {
        Schema::Mbp1 => &[MBP_1, SYMBOL_MAPPING, SYSTEM, ERROR],
        Schema::Trades => &[MBP_0, SYMBOL_MAPPING, SYSTEM, ERROR],
        Schema::Ohlcv1S => &[OHLCV_1S, SYMBOL_MAPPING, SYSTEM, ERROR],
        Schema::Ohlcv1M => &[OHLCV_1M, SYMBOL_MAPPING, SYSTEM, ERROR],
        Schema::Ohlcv1H => &[OHLCV_1H, SYMBOL_MAPPING, SYSTEM, ERROR],
        Schema::Ohlcv1D => &[OHLCV_1D, OHLCV_EOD, SYMBOL_MAPPING, SYSTEM, ERROR],
        _ => &[],
    }
}

/// Whether `record` is a `T` whose declared length is shorter than `T`.
fn shorter_than_its_type<T: dbn::HasRType<Header = dbn::RecordHeader>>(
    record: &dbn::RecordRef,
) -> bool {
    record.has::<T>() && record.header().record_size() < size_of::<T>()
}

/// The records of a DBN file in stream order, as `(instrument_id, ts_event, event)`.
type Events = Vec<(u32, u64, Event)>;

/// The records of one DBN file, as `(instrument_id, ts_event, event)`, and its schema.
///
/// The whole (decompressed) stream is read first, so that a file cut inside a record is
/// caught: the metadata and the records must account for every byte. A record whose type the
/// schema cannot hold is reported as corruption.
fn read_events(path: &Path) -> crate::error::Result<(Schema, Events)> {
    use std::io::Read;
    let len = std::fs::metadata(path)
        .map_err(|e| Mamba2Error::file(path, format!("cannot read: {e}")))?
        .len();
    if len == 0 {
        return Err(Mamba2Error::file(path, "empty file, not a DBN file"));
    }
    let mut bytes = Vec::new();
    dbn::decode::DynReader::from_file(path)
        .map_err(|e| Mamba2Error::file(path, format!("not a readable DBN file: {e}")))?
        .read_to_end(&mut bytes)
        .map_err(|e| {
            Mamba2Error::file(path, format!("corrupt or truncated compressed stream: {e}"))
        })?;
    if bytes.len() < 8 || &bytes[..3] != b"DBN" {
        return Err(Mamba2Error::file(path, "not a DBN file (no DBN header)"));
    }
    let metadata_len = 8 + u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    if metadata_len > bytes.len() {
        return Err(Mamba2Error::file(
            path,
            format!(
                "truncated or corrupt DBN file: the metadata declares {metadata_len} bytes, the stream has {}",
                bytes.len()
            ),
        ));
    }
    check_record_lengths(path, &bytes, metadata_len)?;
    let mut decoder =
        dbn::decode::dbn::Decoder::with_upgrade_policy(&bytes[..], VersionUpgradePolicy::AsIs)
            .map_err(|e| Mamba2Error::file(path, format!("not a readable DBN file: {e}")))?;
    let schema = decoder.metadata().schema.ok_or_else(|| {
        Mamba2Error::file(
            path,
            "the file declares no schema (a mixed-schema file); use one file per schema \
             (mbp-1, trades or ohlcv-*)",
        )
    })?;
    let allowed = allowed_rtypes(schema);
    if allowed.is_empty() {
        return Err(Mamba2Error::file(
            path,
            format!("schema {schema} is not supported (mbp-1, trades or ohlcv-*)"),
        ));
    }
    let mut consumed = metadata_len;
    let mut count = 0usize;
    let mut events = Vec::new();
    loop {
        let record = decoder
            .decode_record_ref()
            .map_err(|e| Mamba2Error::file(path, format!("corrupt after {count} records: {e}")))?;
        let Some(record) = record else { break };
        let header = record.header();
        if !allowed.contains(&header.rtype) {
            return Err(Mamba2Error::file(
                path,
                format!(
                    "corrupt: record {count} has type 0x{:02x}, which a {schema} file cannot hold",
                    header.rtype
                ),
            ));
        }
        // a corrupt timestamp past signed nanosecond time (2262) is refused: the dbn crate
        // marks a missing one with u64::MAX, and one near it would make a grid of millions of
        // rows of a few records (found by fuzzing: 5 million hourly rows from a 464-byte file)
        if header.ts_event > i64::MAX as u64 {
            return Err(Mamba2Error::file(
                path,
                format!(
                    "corrupt: record {count} has timestamp {} ns, past 2262-04-11 (the end of \
                     signed 64-bit nanoseconds since 1970; {} marks a missing one)",
                    header.ts_event,
                    dbn::UNDEF_TIMESTAMP
                ),
            ));
        }
        // a record shorter than its type (a corrupt length byte) is refused here: the dbn
        // crate's typed access asserts on it
        let size = header.record_size();
        if shorter_than_its_type::<Mbp1Msg>(&record)
            || shorter_than_its_type::<TradeMsg>(&record)
            || shorter_than_its_type::<OhlcvMsg>(&record)
        {
            return Err(Mamba2Error::file(
                path,
                format!("corrupt: record {count} ({schema}) declares {size} bytes, too few"),
            ));
        }
        consumed += size;
        count += 1;
        let (id, ts) = (header.instrument_id, header.ts_event);
        if let Some(m) = record.get::<Mbp1Msg>() {
            let level = &m.levels[0];
            if let (Some(bid), Some(ask)) = (price(level.bid_px), price(level.ask_px)) {
                if ask >= bid {
                    events.push((
                        id,
                        ts,
                        Event::Quote {
                            bid,
                            ask,
                            bid_size: level.bid_sz as f64,
                            ask_size: level.ask_sz as f64,
                        },
                    ));
                }
            }
            if m.action as u8 == b'T' {
                if let Some(p) = price(m.price) {
                    events.push((
                        id,
                        ts,
                        Event::Trade {
                            price: p,
                            size: m.size as f64,
                        },
                    ));
                }
            }
        } else if let Some(t) = record.get::<TradeMsg>() {
            if let Some(p) = price(t.price) {
                events.push((
                    id,
                    ts,
                    Event::Trade {
                        price: p,
                        size: t.size as f64,
                    },
                ));
            }
        } else if let Some(b) = record.get::<OhlcvMsg>() {
            if let (Some(close), Some(high), Some(low)) =
                (price(b.close), price(b.high), price(b.low))
            {
                events.push((
                    id,
                    ts,
                    Event::Bar {
                        close,
                        high,
                        low,
                        volume: b.volume as f64,
                    },
                ));
            }
        }
        // control records (symbol mappings, system messages) carry no features
    }
    if consumed != bytes.len() {
        return Err(Mamba2Error::file(
            path,
            format!(
                "truncated or corrupt: {} bytes after the last whole record ({count} records)",
                bytes.len().saturating_sub(consumed)
            ),
        ));
    }
    if events.is_empty() {
        return Err(Mamba2Error::file(
            path,
            format!("no {schema} records with valid prices"),
        ));
    }
    Ok((schema, events))
}

/// The state carried along the grid for one instrument.
#[derive(Default)]
struct GridState {
    mid: Option<f64>,
    last_trade: Option<f64>,
    last_close: Option<f64>,
    spread: f64,
    imbalance: f64,
    volume: f64,
    trades: f64,
}

impl GridState {
    fn reference(&self) -> Option<f64> {
        self.mid.or(self.last_trade).or(self.last_close)
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Quote {
                bid,
                ask,
                bid_size,
                ask_size,
            } => {
                let mid = 0.5 * (bid + ask);
                self.mid = Some(mid);
                self.spread = (ask - bid) / mid;
                let depth = bid_size + ask_size;
                self.imbalance = if depth > 0.0 {
                    (bid_size - ask_size) / depth
                } else {
                    0.0
                };
            }
            Event::Trade { price, size } => {
                self.last_trade = Some(price);
                self.volume += size;
                self.trades += 1.0;
            }
            Event::Bar {
                close,
                high,
                low,
                volume,
            } => {
                self.last_close = Some(close);
                if self.mid.is_none() {
                    self.spread = (high - low) / close;
                }
                self.volume += volume;
            }
        }
    }
}

/// Refuses a stream whose records' lengths (their first byte, in 4-byte words, DBN versions 1
/// to 3) are not whole records: shorter than a record header, or not a multiple of 8 bytes.
/// Every record type is a multiple of 8 bytes (8-aligned, `repr(C)`), and the dbn crate's
/// decoder takes each record in place where the one before it ends, so after such a length it
/// would read the next header from an unaligned address (its debug assertion
/// `unaligned buffer passed to RecordRef::new`, found by fuzzing). Checked on the whole
/// stream before decoding; a last record cut short is left to the decoder.
fn check_record_lengths(
    path: &Path,
    bytes: &[u8],
    metadata_len: usize,
) -> crate::error::Result<()> {
    const HEADER: usize = size_of::<dbn::RecordHeader>();
    let mut at = metadata_len;
    let mut index = 0usize;
    while at < bytes.len() {
        let size = bytes[at] as usize * dbn::RecordHeader::LENGTH_MULTIPLIER;
        if size < HEADER || !size.is_multiple_of(8) {
            return Err(Mamba2Error::file(
                path,
                format!(
                    "corrupt: record {index} declares {size} bytes, not a whole record (at \
                     least {HEADER}, a multiple of 8)"
                ),
            ));
        }
        at += size;
        index += 1;
    }
    Ok(())
}

/// The feature rows of one instrument's time-ordered events (see the module documentation).
fn grid(
    events: &[(u64, Event)],
    interval_ns: u64,
) -> crate::error::Result<(Vec<String>, Vec<Vec<f32>>)> {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let start = first.0 / interval_ns * interval_ns;
    let rows = (last.0 - start) / interval_ns + 1;
    if rows > MAX_GRID_ROWS {
        return Err(Mamba2Error::InvalidInput {
            name: "interval",
            reason: format!(
                "{interval_ns} ns over {} s gives {rows} rows per instrument (at most {MAX_GRID_ROWS})",
                (last.0 - first.0) / 1_000_000_000
            ),
        });
    }
    let mut state = GridState::default();
    let mut previous: Option<f64> = None;
    let (mut stamps, mut out) = (Vec::new(), Vec::new());
    let mut next = 0;
    for k in 0..rows {
        // saturating: a timestamp near the end of u64 (a corrupt file) must not wrap around
        let end = start.saturating_add((k + 1).saturating_mul(interval_ns));
        state.volume = 0.0;
        state.trades = 0.0;
        while next < events.len() && events[next].0 < end {
            state.apply(events[next].1);
            next += 1;
        }
        let reference = state.reference();
        if let (Some(prev), Some(now)) = (previous, reference) {
            let ret = (now / prev).ln();
            stamps.push((start + k * interval_ns).to_string());
            out.push(vec![
                ret as f32,
                state.spread as f32,
                state.imbalance as f32,
                state.volume.ln_1p() as f32,
                state.trades.ln_1p() as f32,
                if ret > 0.0 {
                    1.0
                } else if ret < 0.0 {
                    -1.0
                } else {
                    0.0
                },
            ]);
        }
        previous = reference.or(previous);
    }
    Ok((stamps, out))
}

/// Reads DBN files (MBP-1, trades, OHLCV; plain or zstd) and builds one feature series per
/// instrument on a grid of `interval_ns` nanoseconds (see the module documentation), keyed by
/// instrument id.
///
/// A missing, empty, truncated or corrupt file, a file without a single schema or of an
/// unsupported schema, and a file without usable records are errors naming the file.
pub fn market_series(
    paths: &[PathBuf],
    interval_ns: u64,
) -> crate::error::Result<BTreeMap<u32, TimeSeries>> {
    if paths.is_empty() {
        return Err(Mamba2Error::InvalidInput {
            name: "paths",
            reason: "no DBN file given".into(),
        });
    }
    if interval_ns == 0 {
        return Err(Mamba2Error::InvalidInput {
            name: "interval",
            reason: "must be at least 1 ns".into(),
        });
    }
    let mut per_instrument: BTreeMap<u32, Vec<(u64, Event)>> = BTreeMap::new();
    for path in paths {
        let (_, events) = read_events(path)?;
        for (id, ts, event) in events {
            per_instrument.entry(id).or_default().push((ts, event));
        }
    }
    let mut out = BTreeMap::new();
    for (id, mut events) in per_instrument {
        // stable: records of one timestamp keep their file order
        events.sort_by_key(|e| e.0);
        let (timestamps, values) = grid(&events, interval_ns).map_err(|e| match e {
            // name the files the instrument's records came from
            Mamba2Error::InvalidInput { name, reason } => {
                let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                Mamba2Error::InvalidInput {
                    name,
                    reason: format!("instrument {id} in {}: {reason}", files.join(", ")),
                }
            }
            e => e,
        })?;
        out.insert(
            id,
            TimeSeries {
                timestamps,
                columns: MARKET_FEATURES
                    .iter()
                    .chain(["direction"].iter())
                    .map(|s| s.to_string())
                    .collect(),
                values,
            },
        );
    }
    Ok(out)
}

/// Training, validation and test windows of `seq_len` feature rows (the five
/// [`MARKET_FEATURES`], z-scored with the training part's statistics) and the next row's
/// `target`, split by time 70/10/20.
pub fn market_windows(
    series: &TimeSeries,
    source: &Path,
    seq_len: usize,
    target: MarketTarget,
) -> crate::error::Result<ForecastData> {
    let inputs: Vec<String> = MARKET_FEATURES.iter().map(|s| s.to_string()).collect();
    ForecastData::new(
        series,
        source,
        &inputs,
        &[target.column().to_string()],
        seq_len,
        1,
        Split::Fractions {
            train: 0.7,
            test: 0.2,
        },
    )
}
