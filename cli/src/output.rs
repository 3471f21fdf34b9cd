//! Output: every command builds one [`Output`] (its JSON value and its
//! rendering for people: lines and tables) and [`render`] prints it, as
//! JSON under `--json`, else as text. Also the tables (comfy-table) and
//! the progress bars on stderr (indicatif) every command shares.

use std::io::{IsTerminal, Write};

use comfy_table::{CellAlignment, Table, TableStyle, presets};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::Value;

use crate::error::CliError;

/// What a command prints under `--json`.
#[derive(Debug)]
enum Json {
    /// One pretty document.
    Document(Value),
    /// One compact document per line (JSON lines).
    Lines(Vec<Value>),
}

/// One part of the text rendering.
#[derive(Debug)]
enum Block {
    /// A line of text.
    Line(String),
    /// A table, or this line when it has no rows.
    Table(Box<Table>, String),
}

/// What a command prints: its JSON value and its text for people.
#[derive(Debug)]
#[must_use = "an output is printed by `render`"]
pub struct Output {
    json: Json,
    text: Vec<Block>,
}

/// Encodes a value as JSON (an error only for a value serde can't encode).
pub fn to_json(value: &(impl Serialize + ?Sized)) -> Result<Value, CliError> {
    serde_json::to_value(value).map_err(|e| CliError::new(format!("encoding JSON: {e}")))
}

impl Output {
    /// An output whose JSON is this one document.
    pub fn new(value: &(impl Serialize + ?Sized)) -> Result<Self, CliError> {
        Ok(Output { json: Json::Document(to_json(value)?), text: Vec::new() })
    }

    /// An output whose JSON is one line per item (JSON lines).
    pub fn lines<T: Serialize>(items: &[T]) -> Result<Self, CliError> {
        let values = items.iter().map(to_json).collect::<Result<_, _>>()?;
        Ok(Output { json: Json::Lines(values), text: Vec::new() })
    }

    /// An output with no JSON (nothing printed under `--json`).
    pub fn text_only() -> Self {
        Output { json: Json::Lines(Vec::new()), text: Vec::new() }
    }

    /// Adds a line of text.
    pub fn line(mut self, text: impl std::fmt::Display) -> Self {
        self.text.push(Block::Line(text.to_string()));
        self
    }

    /// Adds a table, shown as `empty` when it has no rows (nothing when
    /// `empty` is empty).
    pub fn table(mut self, table: Table, empty: &str) -> Self {
        self.text.push(Block::Table(Box::new(table), empty.to_owned()));
        self
    }

    /// Prints it on stdout: as JSON, or as text.
    pub fn print(self, json: bool) -> Result<(), CliError> {
        let mut out = std::io::stdout().lock();
        if json {
            match self.json {
                Json::Document(v) => writeln!(out, "{}", pretty(&v)?)?,
                Json::Lines(items) => {
                    for v in &items {
                        writeln!(out, "{v}")?;
                    }
                }
            }
        } else {
            for block in self.text {
                match block {
                    Block::Line(l) => writeln!(out, "{l}")?,
                    Block::Table(t, empty) if t.row_count() == 0 => {
                        if !empty.is_empty() {
                            writeln!(out, "{empty}")?;
                        }
                    }
                    Block::Table(t, _) => writeln!(out, "{}", t.trim_fmt())?,
                }
            }
        }
        out.flush()?;
        Ok(())
    }
}

/// Prints a command's output: JSON under `--json`, else its text.
pub fn render(json: bool, output: Output) -> Result<(), CliError> {
    output.print(json)
}

fn pretty(v: &Value) -> Result<String, CliError> {
    serde_json::to_string_pretty(v).map_err(|e| CliError::new(format!("encoding JSON: {e}")))
}

/// A table in this style with this header.
fn styled(style: TableStyle, header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(style);
    t.set_header(header.iter().copied());
    t
}

/// A plain table for terminals and pipes: no borders, columns two spaces
/// apart, the first column at the margin.
pub fn table(header: &[&str]) -> Table {
    let mut t = styled(presets::NOTHING, header);
    for col in t.column_iter_mut() {
        col.set_padding((0, 2));
    }
    t
}

/// A Markdown table (`| a | b |`), as the bench prints.
pub fn markdown_table(header: &[&str]) -> Table {
    styled(presets::ASCII_MARKDOWN, header)
}

/// Aligns these columns (numbers) to the right.
pub fn align_right(t: &mut Table, columns: impl IntoIterator<Item = usize>) {
    for i in columns {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// A progress bar (or, without `len`, a counter) on stderr, drawn only when
/// stderr is a terminal: off one (a pipe, a file, a CI log) it prints
/// nothing at all.
pub fn progress(len: Option<u64>, template: &str, message: String) -> ProgressBar {
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(len, target);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
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
    fn plain_tables_align_on_the_widest_cell_without_borders() {
        let mut t = table(&["NAME", "N"]);
        t.add_row(["orders", "4"]);
        t.add_row(["a", "12"]);
        assert_eq!(t.trim_fmt(), "NAME    N\norders  4\na       12");
        align_right(&mut t, [1]);
        assert_eq!(t.trim_fmt(), "NAME     N\norders   4\na       12");
    }

    #[test]
    fn markdown_tables_have_pipes() {
        let mut t = markdown_table(&["a", "b"]);
        t.add_row(["1", "2"]);
        assert!(t.to_string().starts_with("| a | b |"), "{t}");
    }
}
