//! The data model shared by every backend.

pub mod append;
pub mod capabilities;
pub mod damage;
pub mod event;
pub mod group;
pub mod lease;
pub mod limits;
pub mod path;
pub mod payload;
pub mod query;
pub mod retention;
pub mod routing;
pub mod stream;
pub mod text;
pub mod time;
