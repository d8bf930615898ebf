//! CSV time series for forecasting: reading, the time split, standardisation with training
//! statistics, window alignment, and clear errors for bad files.

use std::path::Path;

use burn::data::dataset::Dataset;
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries};
use mamba2_burn::Mamba2Error;

/// Hourly rows: a = t, b = 2t + 1, c = (-1)^t.
fn csv(rows: usize) -> String {
    let mut s = String::from("date,a,b,c\n");
    for t in 0..rows {
        s.push_str(&format!(
            "2020-01-01 {t:05},{t},{},{}\n",
            2 * t + 1,
            if t % 2 == 0 { 1 } else { -1 }
        ));
    }
    s
}

fn series(rows: usize) -> TimeSeries {
    TimeSeries::from_reader(csv(rows).as_bytes(), Path::new("synthetic.csv")).unwrap()
}

#[test]
fn reads_columns_and_rows() {
    let s = series(10);
    assert_eq!(s.columns, ["a", "b", "c"]);
    assert_eq!(s.len(), 10);
    assert_eq!(s.values[3], vec![3.0, 7.0, -1.0]);
    assert_eq!(s.timestamps[0], "2020-01-01 00000");
}

#[test]
fn split_standardise_and_windows_follow_the_protocol() {
    let s = series(100);
    let split = Split::Rows {
        train: 60,
        valid: 20,
        test: 20,
    };
    let data = ForecastData::new(
        &s,
        Path::new("synthetic.csv"),
        &["a".into(), "b".into()],
        &["a".into()],
        8,
        4,
        split,
    )
    .unwrap();
    // training statistics: a = 0..59 has mean 29.5 and population std sqrt((60^2 - 1) / 12)
    let std_a = ((60.0f64 * 60.0 - 1.0) / 12.0).sqrt() as f32;
    assert!((data.scaler.mean[0] - 29.5).abs() < 1e-4);
    assert!((data.scaler.std[0] - std_a).abs() < 1e-4);
    // window counts: train 60 - 8 - 4 + 1; validation and test start 8 rows early: 20 - 4 + 1
    assert_eq!(
        (data.train.len(), data.valid.len(), data.test.len()),
        (49, 17, 17)
    );
    let z = |t: f32| (t - 29.5) / std_a;
    // the first validation window: inputs rows 52..60, first target row 60 (the part's first row)
    let w = data.valid.get(0).unwrap();
    assert_eq!(w.input.len(), 8 * 2);
    assert_eq!(w.target.len(), 4);
    assert!((w.input[0] - z(52.0)).abs() < 1e-5);
    assert!((w.target[0] - z(60.0)).abs() < 1e-5);
    // the last test window ends on the last test row
    let last = data.test.get(data.test.len() - 1).unwrap();
    assert!((last.target[3] - z(99.0)).abs() < 1e-5);
    assert!(data.test.get(data.test.len()).is_none());
}

#[test]
fn ett_files_get_the_twelve_four_four_month_split() {
    assert_eq!(
        Split::for_file(Path::new("data/ETTh1.csv")),
        Split::Rows {
            train: 8640,
            valid: 2880,
            test: 2880
        }
    );
    assert_eq!(
        Split::for_file(Path::new("ETTm2.csv")),
        Split::Rows {
            train: 34560,
            valid: 11520,
            test: 11520
        }
    );
    assert_eq!(
        Split::for_file(Path::new("prices.csv")),
        Split::Fractions {
            train: 0.7,
            test: 0.2
        }
    );
    assert_eq!(
        Split::Fractions {
            train: 0.7,
            test: 0.2
        }
        .ranges(100)
        .unwrap(),
        [(0, 70), (70, 80), (80, 100)]
    );
}

#[test]
fn bad_files_and_requests_are_errors() {
    let src = Path::new("bad.csv");
    let err = TimeSeries::from_reader("date,a\n1,2\n2,x\n".as_bytes(), src)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 3") && err.contains("column a"), "{err}");
    let err = TimeSeries::from_reader("date,a,b\n1,2\n".as_bytes(), src)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(matches!(
        TimeSeries::from_reader("date,a\n".as_bytes(), src).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    assert!(matches!(
        TimeSeries::from_reader("date\n1\n".as_bytes(), src).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    assert!(matches!(
        TimeSeries::from_reader("date,a\n1,NaN\n".as_bytes(), src).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    assert!(matches!(
        TimeSeries::from_csv(Path::new("/nonexistent.csv")).unwrap_err(),
        Mamba2Error::File { .. }
    ));

    let s = series(30);
    let split = Split::Rows {
        train: 20,
        valid: 5,
        test: 5,
    };
    match ForecastData::new(&s, src, &["zz".into()], &[], 4, 2, split).unwrap_err() {
        Mamba2Error::InvalidInput { name, reason } => {
            assert!(name == "columns" && reason.contains("zz"), "{reason}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // a test part of 5 rows cannot hold a horizon of 6
    assert!(matches!(
        ForecastData::new(&s, src, &[], &[], 4, 6, split).unwrap_err(),
        Mamba2Error::InvalidInput { .. }
    ));
    // more rows asked for than the file has
    assert!(matches!(
        Split::Rows {
            train: 20,
            valid: 10,
            test: 10
        }
        .ranges(30)
        .unwrap_err(),
        Mamba2Error::InvalidInput { .. }
    ));
}
