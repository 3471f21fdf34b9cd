//! The project's paperwork stays true (issue 33): `docs/architecture.md`'s
//! module table against `src/`, `cli/src/` and `bench/src/`, the README's feature table
//! against `Cargo.toml`, and the license files the manifests name.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The `.rs` lines of a file, or of every `.rs` file under a directory.
fn rust_lines(path: &Path) -> usize {
    if path.is_dir() {
        let mut n = 0;
        for entry in std::fs::read_dir(path).expect("read dir") {
            n += rust_lines(&entry.expect("entry").path());
        }
        n
    } else if path.extension().is_some_and(|e| e == "rs") {
        std::fs::read_to_string(path).expect("read").lines().count()
    } else {
        0
    }
}

/// The rows of the module table: (path, stated line count).
fn module_rows() -> Vec<(String, usize)> {
    let doc = read("docs/architecture.md");
    let table = doc.split("## Module tree").nth(1).expect("a Module tree section");
    let table = table.split("\n## ").next().unwrap_or(table);
    let mut rows = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let path = cells[1].trim_matches('`').to_owned();
        let count = cells[2].replace(',', "").parse().unwrap_or_else(|_| panic!("a line count in {line}"));
        rows.push((path, count));
    }
    rows
}

/// The entries whose module every row must cover: each file and folder in
/// the crate roots, with `src/backends/` and `src/engine/` one level down.
fn modules() -> Vec<String> {
    let mut out = Vec::new();
    let mut list = |dir: &str, skip: &[&str]| {
        for entry in std::fs::read_dir(root().join(dir)).expect("read dir") {
            let path: PathBuf = entry.expect("entry").path();
            let name = path.file_name().expect("a name").to_string_lossy().into_owned();
            if skip.contains(&name.as_str()) || !(path.is_dir() || name.ends_with(".rs")) {
                continue;
            }
            out.push(format!("{dir}/{name}{}", if path.is_dir() { "/" } else { "" }));
        }
    };
    list("src", &["backends", "engine"]);
    list("src/backends", &[]);
    list("src/engine", &[]);
    list("cli/src", &[]);
    list("bench/src", &[]);
    out.sort();
    out
}

#[test]
fn the_module_table_names_every_module_with_its_size() {
    let rows = module_rows();
    assert!(rows.len() > 20, "the table was found: {rows:?}");
    for (path, stated) in &rows {
        let on_disk = root().join(path);
        assert!(on_disk.exists(), "docs/architecture.md names {path}, which does not exist");
        let actual = rust_lines(&on_disk);
        assert!(
            actual <= stated * 2 && *stated <= actual * 2,
            "docs/architecture.md gives {path} {stated} lines; it has {actual}: update the row"
        );
    }
    for module in modules() {
        let covered = rows.iter().any(|(p, _)| *p == module || (p.ends_with('/') && module.starts_with(p.as_str())));
        // A folder is covered when each of its entries has its own row.
        let by_parts = module.ends_with('/') && rows.iter().any(|(p, _)| p.starts_with(&module));
        assert!(covered || by_parts, "{module} has no row in docs/architecture.md's module table");
    }
}

/// The `[features]` a manifest declares, but those marked as internal.
fn features(manifest: &str) -> Vec<String> {
    let text = read(manifest);
    let section = text.split("\n[features]\n").nth(1).expect("a [features] section");
    let section = section.split("\n[").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(name, _)| name.trim().to_owned()))
        .filter(|name| !name.starts_with('#') && name != "internals")
        .collect()
}

#[test]
fn the_readme_lists_the_library_and_command_features() {
    let readme = read("README.md");
    let section = readme.split("## Features").nth(1).expect("a Features section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let listed: Vec<String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('`').nth(1).expect("a feature name").to_owned())
        .collect();
    let mut library = features("Cargo.toml");
    library.sort();
    let mut table = listed.clone();
    table.sort();
    assert_eq!(table, library, "the README's feature table against Cargo.toml's [features]");
    for feature in features("cli/Cargo.toml") {
        assert!(section.contains(&format!("`{feature}`")), "the README does not name rheo-cli's feature {feature}");
    }
}

#[test]
fn the_license_files_the_manifests_name_exist() {
    for manifest in ["Cargo.toml", "cli/Cargo.toml", "bench/Cargo.toml"] {
        assert!(read(manifest).contains("license = \"MIT OR Apache-2.0\""), "{manifest} names its license");
    }
    assert!(read("LICENSE-MIT").contains("Permission is hereby granted, free of charge"));
    assert!(read("LICENSE-APACHE").contains("Apache License\n                        Version 2.0"));
}
