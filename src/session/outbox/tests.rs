use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{DuplexStream, duplex};
use tokio_tungstenite::WebSocketStream;
use tungstenite::Message;
use tungstenite::protocol::Role;

use super::*;

const LARGEST: usize = 128 * 1024;

/// An outbox over one end of an in-memory pipe holding `pipe` bytes, and a
/// WebSocket client reading the other end.
async fn pair(
    pipe: usize,
    limit: usize,
) -> (Arc<Outbox<DuplexStream>>, WebSocketStream<DuplexStream>) {
    let (server, client) = duplex(pipe);
    let outbox = Outbox::new(server, Arc::new(Metrics::default()), limit, LARGEST);
    let reader = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    (outbox, reader)
}

fn frame(tag: u8, len: usize) -> Frame {
    Bytes::from(vec![tag; len])
}

/// The next binary message on `reader`, bounded.
async fn read(reader: &mut WebSocketStream<DuplexStream>) -> Bytes {
    let next = tokio::time::timeout(Duration::from_secs(5), reader.next()).await;
    match next {
        Ok(Some(Ok(Message::Binary(data)))) => data,
        other => panic!("expected a binary message, got {other:?}"),
    }
}

async fn event(outbox: &Outbox<DuplexStream>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), outbox.event())
        .await
        .expect("an outbox event within 5 s")
}

/// Plays the connection task: writes the backlog until it is drained.
async fn drive(outbox: &Outbox<DuplexStream>) -> Event {
    loop {
        match event(outbox).await {
            Event::Backlog(_) => continue,
            other => return other,
        }
    }
}

fn is_pending(outbox: &Outbox<DuplexStream>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    outbox.poll_event(&mut cx).is_pending()
}

#[test]
fn headers_follow_rfc_6455_lengths() {
    assert_eq!(header(0).1, 2);
    assert_eq!(&header(125).0[..2], &[0x82, 125]);
    assert_eq!(&header(126).0[..4], &[0x82, 126, 0, 126]);
    assert_eq!(&header(65_535).0[..4], &[0x82, 126, 0xff, 0xff]);
    let (head, len) = header(65_536);
    assert_eq!(len, 10);
    assert_eq!(&head[..10], &[0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
}

#[tokio::test]
async fn room_frames_and_the_connections_own_writes_arrive_whole_and_in_order() {
    let (outbox, mut reader) = pair(1 << 20, 1 << 20).await;
    let mut own =
        WebSocketStream::from_raw_socket(WsIo(Arc::clone(&outbox)), Role::Server, None).await;
    let sizes = [0, 1, 125, 126, 600, 65_535, 65_536, 100_000];
    for (i, len) in sizes.iter().enumerate() {
        outbox.send(&frame(i as u8, *len));
        own.send(Message::Binary(frame(200 + i as u8, 3)))
            .await
            .expect("own write");
    }
    outbox.send_snapshot(frame(99, 10));
    for (i, len) in sizes.iter().enumerate() {
        assert_eq!(
            read(&mut reader).await,
            frame(i as u8, *len),
            "room frame {i}"
        );
        assert_eq!(
            read(&mut reader).await,
            frame(200 + i as u8, 3),
            "own frame {i}"
        );
    }
    assert_eq!(read(&mut reader).await, frame(99, 10));
    assert!(is_pending(&outbox), "nothing to report");
}

#[tokio::test]
async fn a_full_socket_queues_in_order_and_reports_its_backlog_once() {
    let (outbox, mut reader) = pair(64, 1 << 20).await;
    for i in 0..20 {
        outbox.send(&frame(i, 30));
    }
    let Event::Backlog(since) = event(&outbox).await else {
        panic!("expected a backlog")
    };
    assert!(since <= Instant::now());
    assert!(is_pending(&outbox), "a backlog is reported once");
    let reading = async {
        for i in 0..20 {
            assert_eq!(read(&mut reader).await, frame(i, 30), "frame {i}");
        }
    };
    let (drained, ()) = tokio::join!(event(&outbox), reading);
    assert_eq!(drained, Event::Drained);
    assert!(is_pending(&outbox));
}

#[tokio::test]
async fn past_its_limit_a_member_misses_room_frames_until_a_snapshot() {
    let (outbox, mut reader) = pair(64, 200).await;
    for i in 0..20 {
        outbox.send(&frame(i, 30));
    }
    assert!(outbox.is_lagged());
    assert!(matches!(event(&outbox).await, Event::Backlog(_)));
    // 64 bytes in the pipe and 200 queued: the first 8 whole frames.
    let reading = async {
        for i in 0..8 {
            assert_eq!(read(&mut reader).await, frame(i, 30), "frame {i}");
        }
    };
    let (drained, ()) = tokio::join!(event(&outbox), reading);
    assert_eq!(drained, Event::Drained);
    assert_eq!(event(&outbox).await, Event::Lagged);
    // Still lagged: room frames are dropped, snapshots are not.
    outbox.send(&frame(50, 30));
    outbox.send_snapshot(frame(60, 500));
    outbox.send(&frame(70, 30));
    // The snapshot itself overflows the pipe, but does not count against
    // the limit: the frame after it is kept.
    assert!(!outbox.is_lagged());
    let reading = async {
        assert_eq!(read(&mut reader).await, frame(60, 500));
        assert_eq!(read(&mut reader).await, frame(70, 30));
    };
    let (drained, ()) = tokio::join!(drive(&outbox), reading);
    assert_eq!(drained, Event::Drained);
    assert!(is_pending(&outbox), "the lag is over");
}

#[tokio::test]
async fn a_gone_peer_is_reported_and_nothing_more_is_written() {
    let (outbox, reader) = pair(64, 1 << 20).await;
    drop(reader);
    outbox.send(&frame(1, 30));
    assert_eq!(event(&outbox).await, Event::Failed);
    outbox.send(&frame(2, 30));
    assert_eq!(event(&outbox).await, Event::Failed);
}

#[tokio::test]
async fn the_connections_own_writes_wait_past_the_hard_limit() {
    let (outbox, mut reader) = pair(64, 100).await;
    let mut own =
        WebSocketStream::from_raw_socket(WsIo(Arc::clone(&outbox)), Role::Server, None).await;
    // Far more than the pipe, the limit and twice the largest frame: the
    // sends only complete as the reader reads.
    let big = frame(7, 100_000);
    let sending = async {
        for _ in 0..4 {
            own.send(Message::Binary(big.clone())).await.expect("send");
        }
    };
    let reading = async {
        for _ in 0..4 {
            assert_eq!(read(&mut reader).await, big);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(sending, reading)
    })
    .await
    .expect("sends complete as the reader reads");
    assert!(outbox.lock().queued() <= outbox.hard_limit);
}

#[tokio::test]
async fn a_frame_larger_than_the_limit_still_reaches_a_reader_that_keeps_up() {
    let (outbox, mut reader) = pair(1 << 20, 1_024).await;
    outbox.send(&frame(1, 5_000));
    assert!(!outbox.is_lagged());
    assert_eq!(read(&mut reader).await, frame(1, 5_000));
}

#[tokio::test]
async fn snapshots_into_a_socket_nobody_reads_end_the_connection() {
    // The hard limit is 100 + 2 * LARGEST: the third big snapshot overflows.
    let (outbox, _reader) = pair(64, 100).await;
    for _ in 0..3 {
        outbox.send_snapshot(frame(1, LARGEST - 16));
    }
    assert!(matches!(event(&outbox).await, Event::Overflowed));
    let queued = outbox.lock().queued();
    assert!(queued <= outbox.hard_limit, "{queued}");
    outbox.send_snapshot(frame(2, 10));
    assert_eq!(outbox.lock().queued(), queued, "nothing more is queued");
}

#[tokio::test]
async fn no_room_frame_follows_a_close() {
    let (outbox, mut reader) = pair(1 << 20, 1 << 20).await;
    let mut own =
        WebSocketStream::from_raw_socket(WsIo(Arc::clone(&outbox)), Role::Server, None).await;
    outbox.send(&frame(1, 10));
    own.send(Message::Close(None)).await.expect("close");
    outbox.send(&frame(2, 10));
    assert_eq!(read(&mut reader).await, frame(1, 10));
    let next = tokio::time::timeout(Duration::from_secs(5), reader.next()).await;
    assert!(
        matches!(next, Ok(Some(Ok(Message::Close(_))))),
        "expected the close, got {next:?}"
    );
    // Nothing else was on the wire before the server side went away.
    drop(own);
    drop(outbox);
    match tokio::time::timeout(Duration::from_secs(5), reader.next()).await {
        Ok(None | Some(Err(_))) => {}
        other => panic!("expected the end of the stream, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_backlog_refilled_after_the_connections_own_flush_is_reported_afresh() {
    let (outbox, mut reader) = pair(64, 1 << 20).await;
    let mut own =
        WebSocketStream::from_raw_socket(WsIo(Arc::clone(&outbox)), Role::Server, None).await;
    for i in 0..4 {
        outbox.send(&frame(i, 30));
    }
    let Event::Backlog(first) = event(&outbox).await else {
        panic!("expected a backlog")
    };
    // The connection's own send flushes the whole queue while the peer reads.
    let reading = async {
        for i in 0..4 {
            assert_eq!(read(&mut reader).await, frame(i, 30));
        }
        assert_eq!(read(&mut reader).await, frame(9, 3));
    };
    let sending = async {
        own.send(Message::Binary(frame(9, 3))).await.expect("send");
    };
    tokio::join!(reading, sending);
    tokio::time::advance(Duration::from_millis(5)).await;
    for i in 10..14 {
        outbox.send(&frame(i, 30));
    }
    let Event::Backlog(second) = event(&outbox).await else {
        panic!("expected the new backlog to be reported")
    };
    assert!(
        second > first,
        "the stall clock restarts with the new backlog"
    );
}

#[test]
fn close_frames_are_found_among_whole_frames() {
    let ping = [0x89u8, 0x00];
    let pong = [0x8au8, 0x02, b'h', b'i'];
    let close = [0x88u8, 0x02, 0x03, 0xe8];
    let mut long = vec![0x82u8, 126, 0x01, 0x00];
    long.extend_from_slice(&[0u8; 256]);
    assert!(!has_close_frame(&[]));
    assert!(!has_close_frame(&ping));
    assert!(!has_close_frame(
        &[&ping[..], &pong[..], &long[..]].concat()
    ));
    assert!(has_close_frame(&close));
    assert!(has_close_frame(
        &[&pong[..], &long[..], &close[..]].concat()
    ));
    // A payload byte that looks like a close opcode is skipped over.
    assert!(!has_close_frame(&[0x82, 0x01, 0x88]));
}

#[tokio::test]
async fn a_replaced_member_wakes_its_connection_once_told() {
    let (outbox, _reader) = pair(64 * 1024, 64 * 1024).await;
    assert!(is_pending(&outbox));
    let waiting = {
        let outbox = Arc::clone(&outbox);
        tokio::spawn(async move { event(&outbox).await })
    };
    Sink::removed(&*outbox, Removal::Replaced);
    let woken = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken")
        .expect("task");
    assert_eq!(woken, Event::Removed(Removal::Replaced));
}

#[tokio::test]
async fn a_superseded_member_wakes_its_connection_once_told() {
    let (outbox, _reader) = pair(64 * 1024, 64 * 1024).await;
    assert!(is_pending(&outbox));
    let waiting = {
        let outbox = Arc::clone(&outbox);
        tokio::spawn(async move { event(&outbox).await })
    };
    Sink::superseded(&*outbox);
    let woken = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken")
        .expect("task");
    assert_eq!(woken, Event::Superseded);
}
