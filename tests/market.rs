//! Market data (feature `dbn`): synthetic DBN files written with the `dbn` crate's encoder
//! decode into the documented features on the time grid, in plain and zstd form, for MBP-1,
//! trades and OHLCV; bad files are errors naming the file.
#![cfg(feature = "dbn")]

#[path = "common/mutate.rs"]
mod mutate;

use std::fs::File;
use std::path::{Path, PathBuf};

use burn::data::dataset::Dataset;
use dbn::encode::{DynWriter, EncodeRecord};
use dbn::{
    rtype, BidAskPair, Compression, Mbp1Msg, MetadataBuilder, OhlcvMsg, RecordHeader, SType,
    Schema, TradeMsg,
};
use mamba2_burn::data::market::{market_series, market_windows, MarketTarget, MARKET_FEATURES};
use mamba2_burn::Mamba2Error;
use rand::rngs::StdRng;
use rand::SeedableRng;

const SEC: u64 = 1_000_000_000;
const PX: f64 = 1e9;

fn write_dbn<R: dbn::encode::DbnEncodable>(
    path: &Path,
    schema: Option<Schema>,
    records: &[R],
    compression: Compression,
) {
    let metadata = MetadataBuilder::new()
        .dataset("GLBX.MDP3".to_string())
        .schema(schema)
        .start(0)
        .stype_in(Some(SType::InstrumentId))
        .stype_out(SType::InstrumentId)
        .build();
    let mut writer = DynWriter::new(File::create(path).unwrap(), compression).unwrap();
    {
        let mut encoder = dbn::encode::dbn::Encoder::new(&mut writer, &metadata).unwrap();
        for r in records {
            encoder.encode_record(r).unwrap();
        }
    }
    writer.finish().unwrap();
}

fn quote(id: u32, ts: u64, bid: f64, ask: f64, bid_sz: u32, ask_sz: u32) -> Mbp1Msg {
    Mbp1Msg {
        hd: RecordHeader::new::<Mbp1Msg>(rtype::MBP_1, 1, id, ts),
        price: (bid * PX) as i64,
        size: 1,
        action: b'A' as _,
        side: b'B' as _,
        levels: [BidAskPair {
            bid_px: (bid * PX) as i64,
            ask_px: (ask * PX) as i64,
            bid_sz,
            ask_sz,
            bid_ct: 1,
            ask_ct: 1,
        }],
        ..Default::default()
    }
}

fn mbp_trade(id: u32, ts: u64, price: f64, size: u32, bid: f64, ask: f64) -> Mbp1Msg {
    Mbp1Msg {
        action: b'T' as _,
        price: (price * PX) as i64,
        size,
        ..quote(id, ts, bid, ask, 1, 1)
    }
}

fn trade(id: u32, ts: u64, price: f64, size: u32) -> TradeMsg {
    TradeMsg {
        hd: RecordHeader::new::<TradeMsg>(rtype::MBP_0, 1, id, ts),
        price: (price * PX) as i64,
        size,
        action: b'T' as _,
        side: b'A' as _,
        ..Default::default()
    }
}

fn bar(id: u32, ts: u64, close: f64, high: f64, low: f64, volume: u64) -> OhlcvMsg {
    OhlcvMsg {
        hd: RecordHeader::new::<OhlcvMsg>(rtype::OHLCV_1S, 1, id, ts),
        open: (close * PX) as i64,
        high: (high * PX) as i64,
        low: (low * PX) as i64,
        close: (close * PX) as i64,
        volume,
    }
}

fn close(a: f32, b: f64) -> bool {
    (a as f64 - b).abs() <= 1e-6 * b.abs().max(1.0)
}

/// The MBP-1 case worked by hand:
/// - [0, 1 s): quote 100/101 (sizes 3/1): first reference mid 100.5, no row yet;
/// - [1, 2 s): quote 101/102 (1/1), then a trade of 5 at 101.5 (book unchanged), a trade of 1;
/// - [2, 3 s): quote 99/100 (2/2);
/// - [3, 4 s): nothing; [4, 5 s): quote 99/101 (4/0).
fn mbp_records() -> Vec<Mbp1Msg> {
    vec![
        quote(7, SEC / 2, 100.0, 101.0, 3, 1),
        quote(7, SEC + SEC / 5, 101.0, 102.0, 1, 1),
        mbp_trade(7, SEC + SEC / 2, 101.5, 5, 101.0, 102.0),
        mbp_trade(7, SEC + 3 * SEC / 5, 101.5, 1, 101.0, 102.0),
        quote(7, 2 * SEC + 2 * SEC / 5, 99.0, 100.0, 2, 2),
        quote(7, 4 * SEC + SEC / 10, 99.0, 101.0, 4, 0),
    ]
}

#[test]
fn mbp1_features_match_the_hand_computed_grid_plain_and_zstd() {
    let dir = tempfile::tempdir().unwrap();
    for (name, compression) in [
        ("a.dbn", Compression::None),
        ("a.dbn.zst", Compression::Zstd),
    ] {
        let path = dir.path().join(name);
        write_dbn(&path, Some(Schema::Mbp1), &mbp_records(), compression);
        let series = market_series(&[path], SEC).unwrap();
        let s = &series[&7];
        assert_eq!(
            s.columns,
            [
                "return",
                "spread",
                "imbalance",
                "volume",
                "trades",
                "direction"
            ]
        );
        let expected: [[f64; 6]; 4] = [
            // [1, 2 s)
            [
                (101.5f64 / 100.5).ln(),
                1.0 / 101.5,
                0.0,
                6f64.ln_1p(),
                2f64.ln_1p(),
                1.0,
            ],
            // [2, 3 s)
            [(99.5f64 / 101.5).ln(), 1.0 / 99.5, 0.0, 0.0, 0.0, -1.0],
            // [3, 4 s): nothing happened
            [0.0, 1.0 / 99.5, 0.0, 0.0, 0.0, 0.0],
            // [4, 5 s)
            [(100.0f64 / 99.5).ln(), 2.0 / 100.0, 1.0, 0.0, 0.0, 1.0],
        ];
        assert_eq!(s.values.len(), expected.len(), "{name}: rows");
        for (k, (row, want)) in s.values.iter().zip(&expected).enumerate() {
            for (j, (&got, &w)) in row.iter().zip(want).enumerate() {
                assert!(
                    close(got, w),
                    "{name}: row {k} {}: {got} vs {w}",
                    s.columns[j]
                );
            }
        }
        assert_eq!(s.timestamps[0], SEC.to_string());
    }
}

#[test]
fn trades_and_ohlcv_files_and_several_instruments() {
    let dir = tempfile::tempdir().unwrap();
    let trades = dir.path().join("t.dbn.zst");
    write_dbn(
        &trades,
        Some(Schema::Trades),
        &[
            trade(1, 0, 50.0, 2),
            trade(2, 0, 10.0, 1),
            trade(1, SEC + 1, 51.0, 3),
            trade(1, SEC + 2, 52.0, 4),
            trade(2, 2 * SEC, 11.0, 1),
        ],
        Compression::Zstd,
    );
    let series = market_series(std::slice::from_ref(&trades), SEC).unwrap();
    assert_eq!(series.len(), 2);
    let one = &series[&1].values;
    assert_eq!(one.len(), 1);
    assert!(close(one[0][0], (52f64 / 50.0).ln()));
    assert!(close(one[0][3], 7f64.ln_1p()));
    assert!(close(one[0][4], 2f64.ln_1p()));
    let two = &series[&2].values;
    assert_eq!(two.len(), 2, "a quiet interval, then a trade");
    assert!(close(two[0][0], 0.0) && close(two[1][0], (11f64 / 10.0).ln()));

    let bars = dir.path().join("b.dbn");
    write_dbn(
        &bars,
        Some(Schema::Ohlcv1S),
        &[
            bar(3, 0, 100.0, 101.0, 99.0, 10),
            bar(3, SEC, 102.0, 102.0, 100.0, 20),
        ],
        Compression::None,
    );
    let s = &market_series(&[bars], SEC).unwrap()[&3];
    assert_eq!(s.values.len(), 1);
    let row = &s.values[0];
    assert!(close(row[0], (102f64 / 100.0).ln()));
    assert!(
        close(row[1], 2.0 / 102.0),
        "range as the spread: {}",
        row[1]
    );
    assert!(close(row[3], 20f64.ln_1p()));
}

#[test]
fn windows_have_seq_len_rows_of_five_features_and_the_next_return() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.dbn");
    // a random walk of quotes, 4 a second for 400 s
    let mut price = 100.0f64;
    let mut seed = 12345u64;
    let records: Vec<Mbp1Msg> = (0..1600u64)
        .map(|i| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            price += ((seed >> 33) % 3) as f64 * 0.25 - 0.25;
            quote(9, i * SEC / 4, price, price + 0.25, 1 + (i % 5) as u32, 2)
        })
        .collect();
    write_dbn(&path, Some(Schema::Mbp1), &records, Compression::None);
    let series = &market_series(std::slice::from_ref(&path), SEC).unwrap()[&9];
    assert_eq!(series.values.len(), 399);
    let data = market_windows(series, &path, 60, MarketTarget::Return).unwrap();
    let item = data.train.get(0).unwrap();
    assert_eq!(item.input.len(), 60 * MARKET_FEATURES.len());
    assert_eq!(item.target.len(), 1);
    // the target is row 60's return, standardised with the training statistics
    let (mean, std) = (data.scaler.mean[0], data.scaler.std[0]);
    assert!((item.target[0] - (series.values[60][0] - mean) / std).abs() < 1e-5);
    let total = data.train.len() + data.valid.len() + data.test.len();
    assert!(total > 399 - 3 * 61, "{total} windows");
    let sign = market_windows(series, &path, 60, MarketTarget::Direction).unwrap();
    assert_eq!(sign.train.get(0).unwrap().target.len(), 1);
}

fn file_error(result: Result<impl std::fmt::Debug, Mamba2Error>, file: &Path, words: &str) {
    match result {
        Err(Mamba2Error::File { file: f, reason }) => {
            assert_eq!(f, file);
            assert!(reason.contains(words), "{reason:?} lacks {words:?}");
        }
        other => panic!("expected a file error about {words:?}, got {other:?}"),
    }
}

#[test]
fn bad_files_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.dbn");
    write_dbn(&good, Some(Schema::Mbp1), &mbp_records(), Compression::None);
    let bytes = std::fs::read(&good).unwrap();
    let record = size_of::<Mbp1Msg>();

    let at = |name: &str, data: &[u8]| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let empty = at("empty.dbn", &[]);
    file_error(
        market_series(std::slice::from_ref(&empty), SEC),
        &empty,
        "empty",
    );
    let truncated = at("truncated.dbn", &bytes[..bytes.len() - record / 2]);
    file_error(
        market_series(std::slice::from_ref(&truncated), SEC),
        &truncated,
        "truncated",
    );
    let header_only = at("header.dbn", &bytes[..20]);
    file_error(
        market_series(std::slice::from_ref(&header_only), SEC),
        &header_only,
        "DBN",
    );
    let garbage = at("garbage.dbn", b"this is not market data at all");
    file_error(
        market_series(std::slice::from_ref(&garbage), SEC),
        &garbage,
        "DBN",
    );
    // the rtype byte of the last record overwritten
    let mut bad = bytes.clone();
    let last = bad.len() - record;
    bad[last + 1] = 0x77;
    let corrupt = at("corrupt.dbn", &bad);
    file_error(
        market_series(std::slice::from_ref(&corrupt), SEC),
        &corrupt,
        "corrupt",
    );
    // a record length not a multiple of 8 bytes: the next record would start unaligned,
    // where the dbn crate's decoder takes it in place (found by fuzzing)
    let mut bad = bytes.clone();
    let first = bytes.len() - 6 * record;
    bad[first] = (record / 4 + 1) as u8;
    let unaligned = at("unaligned.dbn", &bad);
    file_error(
        market_series(std::slice::from_ref(&unaligned), SEC),
        &unaligned,
        "record 0 declares",
    );
    let metadata_only = at("no_records.dbn", &bytes[..bytes.len() - 6 * record]);
    file_error(
        market_series(std::slice::from_ref(&metadata_only), SEC),
        &metadata_only,
        "no ",
    );

    let mixed = dir.path().join("mixed.dbn");
    write_dbn(&mixed, None, &mbp_records(), Compression::None);
    file_error(
        market_series(std::slice::from_ref(&mixed), SEC),
        &mixed,
        "schema",
    );
    let mbo = dir.path().join("mbo.dbn");
    write_dbn(
        &mbo,
        Some(Schema::Mbo),
        &[] as &[Mbp1Msg],
        Compression::None,
    );
    file_error(market_series(std::slice::from_ref(&mbo), SEC), &mbo, "mbo");
    let missing = dir.path().join("missing.dbn");
    file_error(
        market_series(std::slice::from_ref(&missing), SEC),
        &missing,
        "cannot read",
    );

    assert!(matches!(
        market_series(&[], SEC),
        Err(Mamba2Error::InvalidInput { .. })
    ));
    assert!(matches!(
        market_series(std::slice::from_ref(&good), 0),
        Err(Mamba2Error::InvalidInput { .. })
    ));
    // a timestamp past signed 64-bit nanoseconds (2262): corrupt, where an hourly grid up to
    // it would be millions of rows of two records (found by fuzzing)
    let future = dir.path().join("future.dbn");
    write_dbn(
        &future,
        Some(Schema::Trades),
        &[trade(1, 0, 1.0, 1), trade(1, i64::MAX as u64 + 1, 1.0, 1)],
        Compression::None,
    );
    file_error(
        market_series(std::slice::from_ref(&future), 3600 * SEC),
        &future,
        "record 1 has timestamp",
    );
    // a 1 ns grid over a long span is refused rather than allocated
    let long = dir.path().join("long.dbn");
    write_dbn(
        &long,
        Some(Schema::Trades),
        &[trade(1, 0, 1.0, 1), trade(1, 10_000 * SEC, 1.0, 1)],
        Compression::None,
    );
    assert!(matches!(
        market_series(&[long], 1),
        Err(Mamba2Error::InvalidInput { .. })
    ));
}

/// DBN inputs of the mutation test (the first four are the unmutated files).
const DBN_INPUTS: usize = 3000;

/// Seeded mutations of valid DBN files (MBP-1 plain and zstd, trades, OHLCV; flipped bits, cut
/// and repeated ranges, extreme integers over length, size and timestamp fields) each decode
/// or give an error naming the file: no panic, and no single allocation above 256 MiB. (A
/// series' rows grow with the span of its timestamps, which a flipped bit can stretch to
/// centuries: the grid here is an hour, so that the largest span a timestamp may have (to 2262,
/// after which one is refused as corrupt) stays within the bound; `MAX_GRID_ROWS` caps the rows
/// at any interval.)
#[test]
fn mutated_dbn_files_decode_or_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, write: &dyn Fn(&Path)| {
        let path = dir.path().join(name);
        write(&path);
        std::fs::read(&path).unwrap()
    };
    let trades: Vec<TradeMsg> = (0..6)
        .map(|k| trade(3, k * SEC, 100.0 + k as f64, 2))
        .collect();
    let bars: Vec<OhlcvMsg> = (0..6)
        .map(|k| bar(3, k * SEC, 100.0 + k as f64, 102.0 + k as f64, 99.0, 10))
        .collect();
    let bases = [
        (
            "mbp.dbn",
            make("b0", &|p| {
                write_dbn(p, Some(Schema::Mbp1), &mbp_records(), Compression::None)
            }),
        ),
        (
            "mbp.dbn.zst",
            make("b1", &|p| {
                write_dbn(p, Some(Schema::Mbp1), &mbp_records(), Compression::Zstd)
            }),
        ),
        (
            "trades.dbn",
            make("b2", &|p| {
                write_dbn(p, Some(Schema::Trades), &trades, Compression::None)
            }),
        ),
        (
            "bars.dbn",
            make("b3", &|p| {
                write_dbn(p, Some(Schema::Ohlcv1S), &bars, Compression::None)
            }),
        ),
    ];
    let mut rng = StdRng::seed_from_u64(31);
    let mut tally = mutate::Tally::default();
    for i in 0..DBN_INPUTS {
        let (name, base) = &bases[i % bases.len()];
        let bytes = if i < bases.len() {
            base.clone()
        } else {
            mutate::mutate_bytes(&mut rng, base)
        };
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        mutate::check(&mut tally, "DBN", i, &[name], 256 << 20, || {
            market_series(std::slice::from_ref(&path), 3600 * SEC)
        });
    }
    println!("DBN: {tally:?}");
    assert_eq!(tally.inputs, DBN_INPUTS);
    assert!(
        tally.accepted >= bases.len() && tally.refused > DBN_INPUTS / 4,
        "{tally:?}"
    );
}
