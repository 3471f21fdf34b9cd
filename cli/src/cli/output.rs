//! Output helpers: JSON documents and lines, and aligned text tables.

use std::io::Write;

use serde::Serialize;

use super::CliError;

/// Prints one pretty JSON document on stdout.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::new(format!("encoding JSON: {e}")))?;
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
}

/// Prints one compact JSON document on its own line (JSON lines) and flushes.
pub fn print_json_line<T: Serialize + ?Sized>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string(value).map_err(|e| CliError::new(format!("encoding JSON: {e}")))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}

/// Prints a line of text on stdout.
pub fn line(text: impl std::fmt::Display) -> Result<(), CliError> {
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
}

/// A text table whose columns are padded to their widest cell.
#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Table { header: header.iter().map(|h| (*h).to_owned()).collect(), rows: Vec::new() }
    }

    /// Adds a row (missing cells are blank).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, the last column unpadded.
    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = r.get(i).map_or("", String::as_str);
                if i + 1 == cols {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(w - cell.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Prints the table on stdout, or `empty` when it has no rows.
    pub fn print(&self, empty: &str) -> Result<(), CliError> {
        let mut out = std::io::stdout().lock();
        if self.rows.is_empty() {
            writeln!(out, "{empty}")?;
        } else {
            write!(out, "{}", self.render())?;
        }
        Ok(())
    }
}

/// A JSON value shortened to `max` characters for a table cell.
pub fn short_json(v: &impl std::fmt::Display, max: usize) -> String {
    let s = v.to_string();
    if s.chars().count() <= max {
        return s;
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(&["NAME", "N"]);
        t.row(vec!["orders".into(), "4".into()]);
        t.row(vec!["a".into(), "12".into()]);
        assert_eq!(t.render(), "NAME    N\norders  4\na       12\n");
    }
}
