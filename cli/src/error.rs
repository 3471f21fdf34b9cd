//! The `rheo` command's error: one line on stderr (one JSON object under
//! `--json`) and an exit code by kind.

use std::process::ExitCode;

/// What kind of failure a [`CliError`] is: its `error` field under
/// `--json`, and its exit code (2 for [`ErrorKind::Usage`], else 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad argument or value: exit 2.
    Usage,
    /// The stream, group, file or cursor does not exist.
    NotFound,
    /// A stream or group of that name already exists.
    AlreadyExists,
    /// The data directory is held by another process.
    Locked,
    /// A write on a read-only open.
    ReadOnly,
    /// A lease no longer holds its delivery.
    StaleLease,
    /// Stored data failed a check (or has an unknown format version).
    Corrupt,
    /// The backend could not be reached, or the outcome is unknown.
    Unavailable,
    /// The disk is full.
    NoSpace,
    /// The backend does not implement the operation.
    Unsupported,
    /// Any other failed operation.
    Failed,
    /// Whoever read stdout closed it (`rheo tail | head`): the command
    /// stops quietly, exit 0.
    Closed,
}

impl ErrorKind {
    /// The name under `--json` (`{"error": "<name>", ...}`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Usage => "usage",
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Locked => "locked",
            ErrorKind::ReadOnly => "read_only",
            ErrorKind::StaleLease => "stale_lease",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Failed => "failed",
            ErrorKind::Closed => "closed",
        }
    }

    /// The kind of a library error: the ones that mean bad input are usage
    /// errors.
    pub fn of(e: &rheo::Error) -> Self {
        use rheo::ErrorKind as K;
        match e.kind() {
            K::InvalidInput => ErrorKind::Usage,
            K::NotFound => ErrorKind::NotFound,
            K::AlreadyExists => ErrorKind::AlreadyExists,
            K::Locked => ErrorKind::Locked,
            K::ReadOnly => ErrorKind::ReadOnly,
            K::StaleLease => ErrorKind::StaleLease,
            K::Corrupt => ErrorKind::Corrupt,
            K::Unavailable | K::Ambiguous => ErrorKind::Unavailable,
            K::NoSpace => ErrorKind::NoSpace,
            K::Unsupported => ErrorKind::Unsupported,
            // (Poisoned, Failed, and kinds a later library adds.)
            _ => ErrorKind::Failed,
        }
    }
}

/// A failed command: the one line printed after `error: ` (under `--json`,
/// one object `{"error": kind, "message": ...}` on stderr).
#[derive(Debug)]
pub struct CliError {
    message: String,
    kind: ErrorKind,
}

impl CliError {
    /// A failed operation (exit code 1) with this message.
    pub fn new(message: impl Into<String>) -> Self {
        CliError::of(ErrorKind::Failed, message)
    }

    /// A bad argument or value (exit code 2) with this message.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::of(ErrorKind::Usage, message)
    }

    /// An error of this kind with this message.
    pub fn of(kind: ErrorKind, message: impl Into<String>) -> Self {
        CliError { message: message.into(), kind }
    }

    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The same error with a sentence added to its message.
    pub fn with_note(mut self, note: impl std::fmt::Display) -> Self {
        self.message = format!("{}. {note}", self.message);
        self
    }

    /// Its exit code: 2 for a usage error, else 1.
    pub fn exit_code(&self) -> ExitCode {
        if self.kind() == ErrorKind::Usage { ExitCode::from(2) } else { ExitCode::FAILURE }
    }

    /// Prints it on stderr: `error: message`, or one JSON object.
    pub fn print(&self, json: bool) {
        if json {
            eprintln!("{}", serde_json::json!({"error": self.kind.name(), "message": self.message}));
        } else {
            eprintln!("error: {}", self.message);
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<rheo::Error> for CliError {
    fn from(e: rheo::Error) -> Self {
        let message = match &e {
            rheo::Error::InvalidArgument { argument: "url", reason } => match needed_feature(reason) {
                // The command's database backends are its features.
                Some(f) => format!(
                    "invalid --backend URL: {reason}. Build the command with it: `cargo install rheo-cli \
                     --features {f}`, or from a checkout `cargo run --release --features {f} -- ...` \
                     (`--features databases` builds all four)"
                ),
                None => format!("invalid --backend URL: {reason}"),
            },
            _ => e.to_string(),
        };
        CliError::of(ErrorKind::of(&e), message)
    }
}

/// The cargo feature a refused URL names (`... needs the cargo feature
/// "postgres" ...`), if that is why it was refused.
fn needed_feature(reason: &str) -> Option<&str> {
    let rest = reason.split_once("needs the cargo feature \"")?.1;
    rest.split_once('"').map(|(f, _)| f)
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader went away (`rheo tail | head`): a quiet stop.
            return CliError::of(ErrorKind::Closed, "stdout was closed");
        }
        CliError::new(format!("writing output: {e}"))
    }
}

/// The result of a command: `Ok(false)` when it ran but found a problem
/// (a corrupt file, a failed ack) and already said so.
pub type CliResult = Result<bool, CliError>;

/// The exit code of a command's result, printing its error first: 0 on
/// success (and when stdout was closed), 1 when it failed or found a
/// problem, 2 on bad arguments.
pub fn finish(result: CliResult, json: bool) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) if e.kind() == ErrorKind::Closed => ExitCode::SUCCESS,
        Err(e) => {
            e.print(json);
            e.exit_code()
        }
    }
}
