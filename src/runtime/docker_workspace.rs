//! A prepared run's workspace on Docker: a named volume (`director-ws-<run id>`) that the
//! setup container prepares and the agent's container then mounts, instead of the tmpfs of an
//! unprepared run. Its root is given to the run's user by unpacking one directory entry into
//! it through a container that is never started (the engine unpacks as root and keeps the
//! archive's owners; a read-only root filesystem refuses uploads outside a volume). A
//! workspace leaves and enters containers as tar streams through the engine's archive API.

use std::collections::HashMap;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, DownloadFromContainerOptions, RemoveContainerOptions,
    RemoveVolumeOptions, UploadToContainerOptions,
};
use futures_util::StreamExt;

use super::{RuntimeError, SETUP_LABEL, TarStream};
use crate::domain::RunId;

/// The label a workspace volume and the containers that mount it carry: the volume's name.
pub const WORKSPACE_LABEL: &str = "director.workspace";

/// The name of a run's workspace volume.
pub fn volume_name(run_id: &RunId) -> String {
    format!("director-ws-{run_id}")
}

/// The name of a run's setup container.
pub fn setup_container_name(run_id: &RunId) -> String {
    format!("{}-setup", super::container_name(run_id))
}

fn engine(e: DockerError) -> RuntimeError {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } => RuntimeError::NotFound(message),
        e => RuntimeError::Engine(e.to_string()),
    }
}

async fn remove_container(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let options = RemoveContainerOptions {
        v: true,
        force: true,
        ..Default::default()
    };
    match docker.remove_container(name, Some(options)).await {
        Ok(())
        | Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(engine(e)),
    }
}

/// Removes a run's setup container and workspace volume; gone already is fine.
pub async fn remove(docker: &Docker, run_id: &RunId) -> Result<(), RuntimeError> {
    remove_container(docker, &setup_container_name(run_id)).await?;
    remove_container(docker, &format!("{}-owner", volume_name(run_id))).await?;
    match docker
        .remove_volume(
            &volume_name(run_id),
            Some(RemoveVolumeOptions { force: true }),
        )
        .await
    {
        Ok(())
        | Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(engine(e)),
    }
}

/// The runs with a workspace volume on the engine (by the label each carries).
pub async fn list(docker: &Docker) -> Result<Vec<RunId>, RuntimeError> {
    let options = bollard::query_parameters::ListVolumesOptions {
        filters: Some(HashMap::from([(
            "label".to_owned(),
            vec![SETUP_LABEL.to_owned()],
        )])),
    };
    let listed = docker.list_volumes(Some(options)).await.map_err(engine)?;
    Ok(listed
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| RunId::parse(v.labels.get(SETUP_LABEL)?).ok())
        .collect())
}

/// Makes the run's workspace volume anew, its root owned by `user` (`uid:gid`), mounted at
/// `workspace`.
pub async fn make(
    docker: &Docker,
    run_id: &RunId,
    image: &str,
    user: &str,
    workspace: &str,
) -> Result<String, RuntimeError> {
    remove(docker, run_id).await?;
    let name = volume_name(run_id);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(name.clone()),
            labels: Some(HashMap::from([
                (WORKSPACE_LABEL.to_owned(), name.clone()),
                (SETUP_LABEL.to_owned(), run_id.to_string()),
            ])),
            ..Default::default()
        })
        .await
        .map_err(engine)?;
    // A container that never starts: the engine unpacks into its mounts as root.
    let owner = format!("{name}-owner");
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(owner.clone()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(image.to_owned()),
                cmd: Some(vec!["true".into()]),
                labels: Some(HashMap::from([(
                    SETUP_LABEL.to_owned(),
                    run_id.to_string(),
                )])),
                network_disabled: Some(true),
                host_config: Some(HostConfig {
                    network_mode: Some("none".into()),
                    mounts: Some(vec![Mount {
                        target: Some(workspace.to_owned()),
                        source: Some(name.clone()),
                        typ: Some(MountType::VOLUME),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .map_err(engine)?;
    let root = root_entry(workspace, user)?;
    let uploaded = docker
        .upload_to_container(
            &created.id,
            Some(UploadToContainerOptions {
                path: "/".into(),
                ..Default::default()
            }),
            bollard::body_full(root.into()),
        )
        .await
        .map_err(engine);
    let removed = remove_container(docker, &created.id).await;
    uploaded?;
    removed?;
    Ok(name)
}

/// A tar of one directory entry, `workspace` (relative to `/`), owned by `user`, mode 0755.
fn root_entry(workspace: &str, user: &str) -> Result<Vec<u8>, RuntimeError> {
    let fail =
        |e: std::io::Error| RuntimeError::Engine(format!("building the workspace's root: {e}"));
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let parse = |s: &str| s.trim().parse::<u64>().unwrap_or(0);
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_size(0);
    h.set_mode(0o755);
    h.set_uid(parse(uid));
    h.set_gid(parse(gid));
    h.set_mtime(0);
    h.set_cksum();
    let rel = format!("{}/", workspace.trim_matches('/'));
    b.append_data(&mut h, rel, std::io::empty()).map_err(fail)?;
    b.into_inner().map_err(fail)
}

/// The workspace of container `id` as a tar stream (entries under the workspace's name).
pub fn export(docker: &Docker, id: &str, workspace: &str) -> TarStream {
    docker
        .download_from_container(
            id,
            Some(DownloadFromContainerOptions {
                path: workspace.to_owned(),
            }),
        )
        .map(|chunk| chunk.map_err(engine))
        .boxed()
}

/// Unpacks `tar` (entries relative to the workspace) into container `id`'s workspace.
pub async fn import(
    docker: &Docker,
    id: &str,
    workspace: &str,
    tar: TarStream,
) -> Result<(), RuntimeError> {
    let body = tar.map(|c| c.map_err(|e| std::io::Error::other(e.to_string())));
    docker
        .upload_to_container(
            id,
            Some(UploadToContainerOptions {
                path: workspace.to_owned(),
                ..Default::default()
            }),
            bollard::body_try_stream(body),
        )
        .await
        .map_err(engine)
}
