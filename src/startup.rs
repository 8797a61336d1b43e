//! Builds the service from [`Settings`]: opens the store, binds the listener, wires the
//! intake, the consumer and the HTTP routes.

use std::net::TcpListener;
use std::sync::{Arc, RwLock};

use actix_web::dev::Server;
use actix_web::{App, HttpServer, middleware::from_fn, web};
use anyhow::Context;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::director::consumer::Consumer;
use crate::http::{AppState, observe_latency, routes};
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Store;

pub struct Application {
    port: u16,
    server: Server,
    shutdown: CancellationToken,
    store: Store,
}

impl Application {
    /// Everything is started except the HTTP server's accept loop, which
    /// [`Application::run_until_stopped`] drives.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let settings = Arc::new(settings);
        let store = Store::connect(&settings.store).await?;
        let metrics = Metrics::new();
        let wake = Arc::new(Notify::new());
        let intake = Intake::spawn(store.clone(), wake.clone());
        let shutdown = CancellationToken::new();

        let bot_login = Arc::new(RwLock::new(settings.forge.bot_login.clone()));
        tokio::spawn(Consumer::new(store.clone(), wake).run(shutdown.clone()));

        let listener = TcpListener::bind(&settings.server.listen)
            .with_context(|| format!("cannot listen on {}", settings.server.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState {
            settings: settings.clone(),
            metrics,
            intake,
            store: store.clone(),
            bot_login,
        });
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .wrap(from_fn(observe_latency))
                .configure(routes)
        })
        .listen(listener)?;
        if settings.server.workers > 0 {
            server = server.workers(settings.server.workers);
        }
        let server = server.shutdown_timeout(10).run();
        tracing::info!(port, "director listening");
        Ok(Self {
            port,
            server,
            shutdown,
            store,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until the process is told to stop (SIGINT/SIGTERM), then stops the consumer.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = self.server.await;
        self.shutdown.cancel();
        result.context("HTTP server failed")
    }
}
