// Keyboard: "/" focuses the search box (unless typing in a field).
document.addEventListener("keydown", (event) => {
  const field = event.target && /^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName);
  const box = document.getElementById("q");
  if (event.key === "/" && !field && box) {
    event.preventDefault();
    box.focus();
    box.select();
  }
});
