//! The tables: created on first use (unless turned off), and checked for the columns this
//! backend reads and writes.

use distlock_api::{Error, ErrorKind, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::advisory::sql::AdvisoryStatements;
use crate::error::map_error;
use crate::sql::Statements;
use crate::BACKEND;

/// Opens one session, creates the tables if asked and missing (under a transaction-scoped
/// advisory lock, so that clients starting together do not race in the catalog), checks
/// their columns, and returns the server's version.
pub(crate) async fn prepare(
    options: &PgConnectOptions,
    sql: &Statements,
    advisory: Option<&AdvisoryStatements>,
    create: bool,
    endpoint: &str,
) -> Result<String> {
    let what = |w: &str| format!("{w} on {endpoint}");
    let mut conn = options
        .connect()
        .await
        .map_err(|e| map_error(e, &what("connecting")))?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| map_error(e, &what("reading the server version")))?;
    let exists: bool = sqlx::query_scalar(
        "SELECT to_regclass(quote_ident($1)) IS NOT NULL AND to_regclass(quote_ident($2)) IS NOT NULL \
         AND to_regclass(quote_ident($3)) IS NOT NULL",
    )
    .bind(&sql.locks)
    .bind(&sql.fencing)
    .bind(&sql.permits)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| map_error(e, &what("looking for the tables")))?;
    let exists = match advisory {
        Some(a) => {
            exists
                && sqlx::query_scalar::<_, bool>("SELECT to_regclass(quote_ident($1)) IS NOT NULL")
                    .bind(&a.table)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| map_error(e, &what("looking for the tables")))?
        }
        None => exists,
    };
    if !exists && create {
        let ddl = format!(
            "BEGIN;\nSELECT pg_advisory_xact_lock(hashtext('distlock: create tables'));\n{}\n{}\nCOMMIT;",
            sql.create_tables(),
            advisory.map(|a| a.create.as_str()).unwrap_or_default()
        );
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&mut conn)
            .await
            .map_err(|e| map_error(e, &what("creating the tables")))?;
    }
    let probe = format!(
        "SELECT name, owner, token, hold_count, expires_at, since, value, value_epoch \
         FROM \"{}\" LIMIT 0",
        sql.locks
    );
    let probe_fencing = format!("SELECT name, token FROM \"{}\" LIMIT 0", sql.fencing);
    let probe_permits = format!(
        "SELECT name, owner, token, hold_count, expires_at, since FROM \"{}\" LIMIT 0",
        sql.permits
    );
    let mut probes = vec![
        (&sql.locks, probe),
        (&sql.fencing, probe_fencing),
        (&sql.permits, probe_permits),
    ];
    if let Some(a) = advisory {
        probes.push((
            &a.table,
            format!(
                "SELECT key, name, owner, token, hold_count, pid, since, value FROM \"{}\" LIMIT 0",
                a.table
            ),
        ));
    }
    for (table, probe) in probes {
        if let Err(e) = sqlx::query(AssertSqlSafe(probe)).execute(&mut conn).await {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "table {table:?} on {endpoint} is missing or lacks the columns this backend \
                     uses (see the crate docs' DDL; create_tables=true creates it)"
                ),
            )
            .with_source(e)
            .with_backend(BACKEND));
        }
    }
    let _ = conn.close().await;
    Ok(version)
}
