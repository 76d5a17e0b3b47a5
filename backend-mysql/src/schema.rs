//! The three tables on connect: created if asked, checked, and brought up from an earlier
//! version's shape.

use distlock_api::{Error, ErrorKind, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection, Executor};

use crate::error::{is_duplicate_column, map_error};
use crate::sql::{self, Statements};

/// Opens one session within the caller's connect timeout: proves the server is reachable and
/// accepts the credentials, creates and checks the tables, and reads the server version.
pub(crate) async fn prepare(
    options: &MySqlConnectOptions,
    sql: &Statements,
    create_tables: bool,
    endpoint: &str,
) -> Result<String> {
    let fail = |what: &str| {
        let what = format!("{what} on {endpoint}");
        move |e: sqlx::Error| map_error(e, &what)
    };
    let mut conn = MySqlConnection::connect_with(options)
        .await
        .map_err(fail("connecting"))?;
    if create_tables {
        for ddl in [&sql.create_locks, &sql.create_fencing, &sql.permit.create] {
            conn.execute(AssertSqlSafe(ddl.clone()))
                .await
                .map_err(fail("creating the lock tables"))?;
        }
    }
    // Tables made by earlier versions: a narrower owner column (for owner ids without a tag,
    // a longer id would be refused or, without strict mode, cut short and never match again),
    // no `granted_at` column, no `value` and `value_token` columns (elections). Fixed on
    // connect, or refused with the statements to run.
    let width: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(sql.owner_width.clone()))
        .fetch_optional(&mut conn)
        .await
        .map_err(fail("checking the lock table's owner column"))?;
    let exists = width.is_some();
    let narrow = width.flatten().filter(|&w| w < sql::OWNER_COLUMN_WIDTH);
    let (granted_at, value, value_token): (i64, i64, i64) =
        sqlx::query_as(AssertSqlSafe(sql.later_columns.clone()))
            .fetch_one(&mut conn)
            .await
            .map_err(fail("checking the lock table's columns"))?;
    let mut fixes = Vec::new();
    if narrow.is_some() {
        fixes.push(&sql.widen_owner);
    }
    for (has, add) in [
        (granted_at, &sql.add_granted_at),
        (value, &sql.add_value),
        (value_token, &sql.add_value_token),
    ] {
        if exists && has == 0 {
            fixes.push(add);
        }
    }
    if !fixes.is_empty() && !create_tables {
        let run: Vec<String> = fixes.iter().map(|f| format!("`{f}`")).collect();
        let narrow = match narrow {
            Some(width) => format!(
                "its owner column holds {width} bytes, fewer than the {} an owner id can take; ",
                sql::OWNER_COLUMN_WIDTH
            ),
            None => String::new(),
        };
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "the lock table on {endpoint} was made by an earlier version: {narrow}run {}",
                run.join(" and ")
            ),
        ));
    }
    for fix in fixes {
        match conn.execute(AssertSqlSafe(fix.clone())).await {
            // Clients connecting at once all see the column missing; the first adds it.
            Err(e) if is_duplicate_column(&e) => {}
            done => {
                done.map_err(fail("updating the lock table to this version"))?;
            }
        }
    }
    for check in [&sql.check_locks, &sql.check_fencing, &sql.permit.check] {
        conn.execute(AssertSqlSafe(check.clone()))
            .await
            .map_err(|e| {
                map_error(
                    e,
                    &format!(
                        "checking the lock tables on {endpoint} (created with the DDL in the \
                     distlock-mysql docs?)"
                    ),
                )
            })?;
    }
    let version: String = sqlx::query_scalar(sql::VERSION)
        .fetch_one(&mut conn)
        .await
        .map_err(fail("reading the server version"))?;
    // A failed goodbye does not make the session we just used any less proven.
    let _ = conn.close().await;
    Ok(version)
}
