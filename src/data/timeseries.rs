//! Multivariate time series from CSV for forecasting: a timestamp column and numeric columns,
//! split by time into training, validation and test parts, z-scored with the training part's
//! statistics, and cut into windows of `lookback` inputs and `horizon` targets.
//!
//! The split follows the long-horizon forecasting protocol (Informer, Autoformer, PatchTST):
//! the validation and test windows start `lookback` rows before their part, so that their first
//! target is the part's first row; windows have stride 1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::data::dataset::Dataset;

use crate::error::Mamba2Error;

/// A table of numeric columns with one timestamp per row.
#[derive(Clone, Debug)]
pub struct TimeSeries {
    /// The timestamp of each row, as written in the file.
    pub timestamps: Vec<String>,
    /// Names of the numeric columns.
    pub columns: Vec<String>,
    /// Row-major values, `[rows][columns]`.
    pub values: Vec<Vec<f32>>,
}

impl TimeSeries {
    /// Reads a CSV file with a header row. The first column is the timestamp; every other
    /// column must hold a number in every row.
    #[cfg(feature = "timeseries")]
    #[cfg_attr(docsrs, doc(cfg(feature = "timeseries")))]
    pub fn from_csv(path: &Path) -> crate::error::Result<Self> {
        let file = std::fs::File::open(path)
            .map_err(|e| Mamba2Error::file(path, format!("cannot open: {e}")))?;
        Self::from_reader(file, path)
    }

    /// Reads CSV text from `reader`; `source` names it in errors.
    #[cfg(feature = "timeseries")]
    #[cfg_attr(docsrs, doc(cfg(feature = "timeseries")))]
    pub fn from_reader<R: std::io::Read>(reader: R, source: &Path) -> crate::error::Result<Self> {
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(reader);
        let header = csv
            .headers()
            .map_err(|e| Mamba2Error::file(source, format!("cannot read the header: {e}")))?
            .clone();
        if header.len() < 2 {
            return Err(Mamba2Error::file(
                source,
                "need a timestamp column and at least one numeric column",
            ));
        }
        let columns: Vec<String> = header
            .iter()
            .skip(1)
            .map(|c| c.trim().to_string())
            .collect();
        let (mut timestamps, mut values) = (Vec::new(), Vec::new());
        for (i, record) in csv.records().enumerate() {
            let line = i + 2;
            let record =
                record.map_err(|e| Mamba2Error::file(source, format!("line {line}: {e}")))?;
            if record.len() != header.len() {
                return Err(Mamba2Error::file(
                    source,
                    format!(
                        "line {line}: {} fields, the header has {}",
                        record.len(),
                        header.len()
                    ),
                ));
            }
            timestamps.push(record[0].to_string());
            let row = record
                .iter()
                .skip(1)
                .zip(&columns)
                .map(|(cell, name)| match cell.trim().parse::<f32>() {
                    Ok(v) if v.is_finite() => Ok(v),
                    _ => Err(Mamba2Error::file(
                        source,
                        format!("line {line}, column {name}: {cell:?} is not a finite number"),
                    )),
                })
                .collect::<crate::error::Result<Vec<f32>>>()?;
            values.push(row);
        }
        if values.is_empty() {
            return Err(Mamba2Error::file(source, "no data rows"));
        }
        Ok(Self {
            timestamps,
            columns,
            values,
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Indices of the named columns (all numeric columns when `names` is empty).
    pub fn column_indices(&self, names: &[String]) -> crate::error::Result<Vec<usize>> {
        if names.is_empty() {
            return Ok((0..self.columns.len()).collect());
        }
        names
            .iter()
            .map(|n| {
                self.columns
                    .iter()
                    .position(|c| c == n)
                    .ok_or_else(|| Mamba2Error::InvalidInput {
                        name: "columns",
                        reason: format!("no column {n:?}; the file has {:?}", self.columns),
                    })
            })
            .collect()
    }
}

/// How the rows are divided into training, validation and test parts, in time order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Split {
    /// Fixed row counts (the ETT hourly protocol: 8,640 / 2,880 / 2,880).
    Rows {
        /// Training rows.
        train: usize,
        /// Validation rows.
        valid: usize,
        /// Test rows.
        test: usize,
    },
    /// Fractions of the rows for training and test; validation gets the rest
    /// (the custom-dataset protocol: 0.7 / 0.2).
    Fractions {
        /// Training fraction.
        train: f64,
        /// Test fraction.
        test: f64,
    },
}

impl Split {
    /// The split the forecasting literature uses for a file: 12/4/4 months for ETTh* (hourly)
    /// and ETTm* (15 minutes), 70/10/20% otherwise.
    pub fn for_file(path: &Path) -> Split {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let month = if name.starts_with("ETTh") {
            Some(30 * 24)
        } else if name.starts_with("ETTm") {
            Some(30 * 24 * 4)
        } else {
            None
        };
        match month {
            Some(m) => Split::Rows {
                train: 12 * m,
                valid: 4 * m,
                test: 4 * m,
            },
            None => Split::Fractions {
                train: 0.7,
                test: 0.2,
            },
        }
    }

    /// Row ranges `[start, end)` of the three parts for `rows` rows.
    pub fn ranges(&self, rows: usize) -> crate::error::Result<[(usize, usize); 3]> {
        let (train, valid, test) = match *self {
            Split::Rows { train, valid, test } => (train, valid, test),
            Split::Fractions { train, test } => {
                let tr = (rows as f64 * train) as usize;
                let te = (rows as f64 * test) as usize;
                (tr, rows.saturating_sub(tr + te), te)
            }
        };
        if train + valid + test > rows || train == 0 || valid == 0 || test == 0 {
            return Err(Mamba2Error::InvalidInput {
                name: "split",
                reason: format!("{rows} rows cannot give {train} training, {valid} validation and {test} test rows"),
            });
        }
        Ok([
            (0, train),
            (train, train + valid),
            (train + valid, train + valid + test),
        ])
    }
}

/// Per-column mean and standard deviation of the training rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Standardizer {
    /// Means.
    pub mean: Vec<f32>,
    /// Standard deviations (population), floored at 1e-8.
    pub std: Vec<f32>,
}

impl Standardizer {
    /// Fits on `rows`.
    pub fn fit(rows: &[Vec<f32>]) -> Self {
        let n = rows.len().max(1) as f64;
        let width = rows.first().map_or(0, |r| r.len());
        let mean: Vec<f64> = (0..width)
            .map(|j| rows.iter().map(|r| r[j] as f64).sum::<f64>() / n)
            .collect();
        let std = (0..width)
            .map(|j| {
                let var = rows
                    .iter()
                    .map(|r| (r[j] as f64 - mean[j]).powi(2))
                    .sum::<f64>()
                    / n;
                var.sqrt().max(1e-8) as f32
            })
            .collect();
        Self {
            mean: mean.into_iter().map(|m| m as f32).collect(),
            std,
        }
    }

    /// `(x - mean) / std`, column by column.
    pub fn transform(&self, row: &[f32]) -> Vec<f32> {
        row.iter()
            .zip(&self.mean)
            .zip(&self.std)
            .map(|((x, m), s)| (x - m) / s)
            .collect()
    }
}

/// One forecasting window.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowItem {
    /// `lookback` rows of the input columns, row-major `[lookback * n_inputs]`.
    pub input: Vec<f32>,
    /// The next `horizon` rows of the target columns, row-major `[horizon * n_targets]`.
    pub target: Vec<f32>,
}

/// The windows of one part of a standardised series.
#[derive(Clone, Debug)]
pub struct WindowDataset {
    rows: Arc<Vec<Vec<f32>>>,
    inputs: Arc<Vec<usize>>,
    targets: Arc<Vec<usize>>,
    lookback: usize,
    horizon: usize,
    first: usize,
    count: usize,
}

impl WindowDataset {
    /// Inputs per time step.
    pub fn n_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Targets per time step.
    pub fn n_targets(&self) -> usize {
        self.targets.len()
    }

    /// The series' columns of the targets, in target order (the columns of the
    /// [`Standardizer`] that standardised them).
    pub fn target_columns(&self) -> &[usize] {
        &self.targets
    }
}

impl Dataset<WindowItem> for WindowDataset {
    fn get(&self, index: usize) -> Option<WindowItem> {
        if index >= self.count {
            return None;
        }
        let s = self.first + index;
        let pick =
            |r: usize, cols: &[usize]| cols.iter().map(|&c| self.rows[r][c]).collect::<Vec<f32>>();
        let input = (s..s + self.lookback)
            .flat_map(|r| pick(r, &self.inputs))
            .collect();
        let t0 = s + self.lookback;
        let target = (t0..t0 + self.horizon)
            .flat_map(|r| pick(r, &self.targets))
            .collect();
        Some(WindowItem { input, target })
    }

    fn len(&self) -> usize {
        self.count
    }
}

/// A standardised series cut into training, validation and test windows.
#[derive(Clone, Debug)]
pub struct ForecastData {
    /// Training windows.
    pub train: WindowDataset,
    /// Validation windows.
    pub valid: WindowDataset,
    /// Test windows.
    pub test: WindowDataset,
    /// The training part's statistics, for every numeric column.
    pub scaler: Standardizer,
    /// The source, for messages.
    pub source: PathBuf,
}

impl ForecastData {
    /// Splits `series`, standardises every column with the training rows' statistics, and
    /// cuts windows of `lookback` rows of `inputs` followed by `horizon` rows of `targets`
    /// (column names; empty means all numeric columns).
    pub fn new(
        series: &TimeSeries,
        source: &Path,
        inputs: &[String],
        targets: &[String],
        lookback: usize,
        horizon: usize,
        split: Split,
    ) -> crate::error::Result<Self> {
        if lookback == 0 || horizon == 0 {
            return Err(Mamba2Error::InvalidInput {
                name: "lookback/horizon",
                reason: format!("both must be at least 1, got {lookback} and {horizon}"),
            });
        }
        let input_cols = Arc::new(series.column_indices(inputs)?);
        let target_cols = Arc::new(series.column_indices(targets)?);
        let [train, valid, test] = split.ranges(series.len())?;
        let scaler = Standardizer::fit(&series.values[train.0..train.1]);
        let rows = Arc::new(
            series
                .values
                .iter()
                .map(|r| scaler.transform(r))
                .collect::<Vec<_>>(),
        );
        let part = |(start, end): (usize, usize),
                    name: &str|
         -> crate::error::Result<WindowDataset> {
            // windows begin `lookback` rows early so that the first target is the part's first row
            let first = start.saturating_sub(if start == 0 { 0 } else { lookback });
            let span = end - first;
            if span < lookback + horizon {
                return Err(Mamba2Error::InvalidInput {
                    name: "lookback/horizon",
                    reason: format!(
                        "the {name} part of {} has {} rows, too few for a window of {lookback} + {horizon}",
                        source.display(),
                        end - start
                    ),
                });
            }
            Ok(WindowDataset {
                rows: rows.clone(),
                inputs: input_cols.clone(),
                targets: target_cols.clone(),
                lookback,
                horizon,
                first,
                count: span - lookback - horizon + 1,
            })
        };
        Ok(Self {
            train: part(train, "training")?,
            valid: part(valid, "validation")?,
            test: part(test, "test")?,
            scaler,
            source: source.to_path_buf(),
        })
    }
}
