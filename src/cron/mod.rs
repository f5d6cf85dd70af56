//! Cron: the expression dialect, firing times in IANA time zones, and the
//! registration body. Pure code; the engine keeps the entries and fires them.

mod expr;
mod next;
mod registration;

pub use expr::CronExpr;
pub use next::{CronSchedule, DueFiring, NextFire, parse_timezone};
pub use registration::{
    CronDefinition, JobTemplate, OverlapPolicy, is_valid_cron_name, parse_cron_body, patch_cron_body,
};
